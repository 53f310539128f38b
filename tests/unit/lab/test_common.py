"""What the lab's experiments share (`lab/common.py`): single-query softmax attention by its definition,
orthonormal bases, and results made JSON-ready."""

import dataclasses
import json

import torch

from iattention.lab.common import DTYPE, attend, orthonormal, to_jsonable


def test_attend_is_the_softmax_of_the_scores_weighting_the_values():
    g = torch.Generator().manual_seed(0)
    K, q, V = (torch.randn(*s, generator=g, dtype=DTYPE) for s in ((2, 5, 3), (2, 3), (2, 5, 4)))
    alpha, c = attend(K, q, V)
    for b in range(2):
        scores = [float(K[b, i] @ q[b]) for i in range(5)]
        z = sum(torch.tensor(scores, dtype=DTYPE).exp())
        want = torch.tensor(scores, dtype=DTYPE).exp() / z
        assert torch.allclose(alpha[b], want)
        assert torch.allclose(c[b], sum(want[i] * V[b, i] for i in range(5)))


def test_orthonormal_columns_and_a_seeded_draw():
    Q = orthonormal(6, 3, torch.Generator().manual_seed(1))
    assert Q.shape == (6, 3) and Q.dtype == DTYPE
    assert torch.allclose(Q.T @ Q, torch.eye(3, dtype=DTYPE))
    assert torch.equal(Q, orthonormal(6, 3, torch.Generator().manual_seed(1)))


def test_results_become_json_nested_as_they_were():
    @dataclasses.dataclass
    class Result:
        name: str
        values: torch.Tensor
        parts: tuple

    obj = {"r": Result("a", torch.tensor([1.5, 2.0]), (torch.tensor(3), [4]))}
    assert json.loads(json.dumps(to_jsonable(obj))) == {"r": {"name": "a", "values": [1.5, 2.0], "parts": [3, [4]]}}
