"""The chain topology on a real in-process rollout worker: turns, handoffs and ownership."""

from satseq.actors.rollout import RolloutWorker
from satseq.actors.topology import chain_rollouts
from satseq.actors.trajectory import SamplingSpec
from satseq.algo.masks import NO_OWNER


def test_agents_take_turns_on_one_sequence_and_own_their_tokens(raw_tiny_model):
    worker = RolloutWorker({"first": raw_tiny_model, "second": raw_tiny_model}, "hf", {}, seed=0)
    tokenizer = worker.engines["first"].tokenizer
    prompts = [
        tokenizer.encode("1+2=", add_special_tokens=False),
        tokenizer.encode("3+4=", add_special_tokens=False),
    ]
    handoff = tokenizer.encode("\ncheck it:", add_special_tokens=False)
    spec = SamplingSpec(temperature=1.0, max_new_tokens=6, seed=3)
    requests_seen = []

    def generate(requests, spec):
        requests_seen.extend(requests)
        return worker.generate(requests, spec)

    chains = chain_rollouts(
        generate, prompts, ["first", "second"], [[], handoff], group_size=2, spec=spec
    )

    assert [c.prompt_index for c in chains] == [0, 0, 1, 1]
    for chain in chains:
        (s0, e0), (s1, e1) = chain.meta["turn_bounds"]
        assert s0 == 0 and s1 == e0 + len(handoff) and e1 == len(chain.response_ids)
        assert chain.owner_ids[s0:e0] == [0] * (e0 - s0) and chain.response_mask[s0:e0] == [1] * (
            e0 - s0
        )
        assert chain.response_ids[e0:s1] == handoff
        assert chain.owner_ids[e0:s1] == [NO_OWNER] * len(handoff) and chain.response_mask[
            e0:s1
        ] == [0] * len(handoff)
        assert chain.owner_ids[s1:e1] == [1] * (e1 - s1) and 1 <= e1 - s1 <= 6
    # the second agent's context was the problem, the first turn and the handoff
    second_turn_contexts = [r.prompt_ids for r in requests_seen if r.agent == "second"]
    for chain, context in zip(chains, second_turn_contexts, strict=True):
        s1 = chain.meta["turn_bounds"][1][0]
        assert context == chain.prompt_ids + chain.response_ids[:s1]
