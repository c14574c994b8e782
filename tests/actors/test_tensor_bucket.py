"""`TensorBucket`: the weights that cross Ray's object store come out as they went in (names,
order, dtypes, shapes, values), through pickle's out-of-band buffers and through Ray itself."""

import pickle

import ray
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.actors.tensor_bucket import TensorBucket

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
SHAPES = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def same(a: TensorBucket, b: TensorBucket) -> bool:
    return (
        type(b) is TensorBucket
        and list(a) == list(b)
        and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), SHAPES), max_size=6), st.integers(0, 2**16))
def test_a_bucket_comes_back_whole_from_out_of_band_pickling(layouts, seed):
    generator = torch.Generator().manual_seed(seed)
    bucket = TensorBucket(
        {
            f"layers.{i}.w": (torch.randn(shape, generator=generator) * 100).to(dtype)
            for i, (dtype, shape) in enumerate(layouts)
        }
    )
    buffers = []
    data = pickle.dumps(bucket, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(bucket), "each tensor is one out-of-band buffer"
    assert len(data) < 1000 + 100 * len(bucket), "no tensor's bytes are in the stream"
    assert same(bucket, pickle.loads(data, buffers=buffers))


def test_a_bucket_of_views_sends_each_view_alone():
    """A transposed or sliced tensor (a view of a larger storage) sends its own elements."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    bucket = TensorBucket({"t": base.t(), "row": base[1], "scalar": torch.tensor(2.5)})
    assert same(bucket, pickle.loads(pickle.dumps(bucket, protocol=5)))


def test_a_bucket_crosses_the_object_store_and_a_task_reads_it(ray_cluster):
    bucket = TensorBucket(
        {"a": torch.randn(16, 8).bfloat16(), "b": torch.arange(5), "c": torch.randn(3, 3)}
    )

    @ray.remote(num_cpus=0)
    def checksum(received: TensorBucket) -> tuple[str, dict[str, float]]:
        return type(received).__name__, {k: float(t.float().sum()) for k, t in received.items()}

    assert same(bucket, ray.get(ray.put(bucket)))
    kind, sums = ray.get(checksum.remote(bucket))
    assert kind == "TensorBucket" and sums == {k: float(t.float().sum()) for k, t in bucket.items()}
