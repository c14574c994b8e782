"""Code execution for tool-augmented rollouts (design §5, §6).

One interface, `SandboxBackend.execute(ExecutionRequest) -> ExecutionResult`, two backends:
- `local.LocalBackend`: isolated slots on this machine (bubblewrap, seccomp, Landlock, cgroups,
  a uid per slot, rlimits), refusing to start below `sandbox.min_isolation`;
- `fusion_client.FusionBackend`: a SandboxFusion `/run_code` server over HTTP;
and around them `pool.SandboxPool` (the Ray actor) and `server` (`satseq sandbox serve`).

This package imports nothing on purpose: the slot supervisor process imports some of its
modules and must start fast, without pydantic or Ray. Import from the modules.
"""
