from satseq.actors.topology import mixture_assignment


def test_mixture_round_robin_with_rotating_offset():
    # 3 agents, G = 4: prompt p starts at agent (first + p) mod 3
    assert mixture_assignment(3, 4, 3, first_prompt=0) == [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0, 1, 2]]
    assert mixture_assignment(1, 2, 3, first_prompt=5) == [[2, 0]]
