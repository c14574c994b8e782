"""Requests are validated where they are made; results survive JSON (Ray, HTTP) exactly."""

import pytest
from pydantic import ValidationError

from satseq.sandbox.types import ExecutionRequest, ExecutionResult, IsolationLevel, Status


def test_a_request_needs_only_code_and_leaves_limits_to_the_backend():
    request = ExecutionRequest(code="print(1)")
    assert request.language == "python"
    assert (request.timeout_s, request.memory_mb, request.max_output_bytes) == (None, None, None)


@pytest.mark.parametrize("name", ["/etc/passwd", "../up.txt", "a/../../up.txt", "", "a\x00b", "."])
def test_file_names_must_stay_inside_the_working_directory(name):
    with pytest.raises(ValidationError, match="file name"):
        ExecutionRequest(code="", files={name: b""})
    with pytest.raises(ValidationError, match="file name"):
        ExecutionRequest(code="", fetch_files=[name])


def test_nested_relative_names_are_normalised():
    request = ExecutionRequest(code="", files={"data/./in.txt": b"x"})
    assert list(request.files) == ["data/in.txt"]


def test_the_code_file_name_is_reserved():
    with pytest.raises(ValidationError, match=r"main\.py"):
        ExecutionRequest(code="", files={"main.py": b""})
    ExecutionRequest(code="", language="bash", files={"main.py": b""})


@pytest.mark.parametrize(
    "limits", [{"timeout_s": 0}, {"timeout_s": 10_000}, {"memory_mb": 1}, {"max_output_bytes": 0}]
)
def test_limits_out_of_range_are_rejected(limits):
    with pytest.raises(ValidationError):
        ExecutionRequest(code="", **limits)


def test_unknown_languages_are_rejected():
    with pytest.raises(ValidationError):
        ExecutionRequest(code="", language="cobol")


def test_binary_files_survive_a_json_round_trip():
    content = bytes(range(256))
    request = ExecutionRequest(code="", files={"blob.bin": content})
    assert ExecutionRequest.model_validate_json(request.model_dump_json()) == request
    result = ExecutionResult(
        status=Status.OK,
        fetched_files={"out.bin": content},
        backend="local",
        isolation=IsolationLevel.FULL,
    )
    assert ExecutionResult.model_validate_json(result.model_dump_json()) == result


def test_isolation_levels_are_ordered():
    ranks = [level.rank for level in IsolationLevel]
    assert ranks == sorted(ranks)
    assert IsolationLevel.FULL.rank > IsolationLevel.NAMESPACES.rank > IsolationLevel.NONE.rank
