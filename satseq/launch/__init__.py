"""The launch layer: what every command (train, eval, serve, offline estimate) starts from.

- `connection`: join a Ray cluster, or start a local instance;
- `builders`: the objects config sections build that more than one command uses (prompt format,
  reward scorer, sampling settings, engine options, sandbox backend);
- `actors`: start rollout actors and the sandbox pool.

It imports `actors`, `sandbox`, `rewards`, `data` and `config`, never `cluster`: evaluation and
serving start what they need from here, and need no trainer.
"""
