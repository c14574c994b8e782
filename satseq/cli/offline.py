"""`satseq offline-values split|estimate|merge`: the SPO offline-value pipeline (design §4, §10).

The flags keep the seeds' spellings (`--output_dir`, `--num_subsets`, ...); each also takes the
dashed spelling the rest of `satseq` uses. A dataset is read as the config's `data` section
says (`data.split`, `data.field_map`, `data.skip_bad_rows`).

    satseq offline-values split --dataset data/train.parquet --output_dir splits --num_subsets 5
    for i in 0 1 2 3 4; do
      satseq offline-values estimate --data_file splits/subset_$i.parquet \\
          --model_path Qwen/Qwen3-8B --output_dir estimates --n_samples 8 \\
          --exp_name offline_value_estimation_subset_$i --config configs/spo.yaml
    done
    satseq offline-values merge --input_dir estimates --output_file splits/offline_values.json
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import SetOption, fail, resolve_config
from satseq.config import ConfigError
from satseq.data import DataError
from satseq.offline.estimate import estimate_offline_values
from satseq.offline.layout import DEFAULT_RESULTS_PATTERN
from satseq.offline.merge import merge_offline_values
from satseq.offline.split import split_dataset

offline_values_app = typer.Typer(
    help="SPO offline values: split a dataset, estimate each subset, merge into {prompt: scores}.",
    no_args_is_help=True,
)

USER_ERRORS = (DataError, ConfigError)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="YAML config (data, rollout, reward); default the quickstart"),
]


@contextmanager
def _user_errors_exit(*extra: type[Exception]) -> Iterator[None]:
    """A user's mistake (bad data, config, model path) ends the command with its message and
    status 2, never a traceback."""
    try:
        yield
    except (*USER_ERRORS, *extra) as error:
        raise fail(str(error)) from None


@offline_values_app.command("split")
def split(
    dataset: Annotated[
        str, typer.Option("--dataset", help="a .jsonl/.parquet file or a Hub name[:config]")
    ],
    output_dir: Annotated[
        Path, typer.Option("--output_dir", "--output-dir", help="where subset_<i>.parquet go")
    ],
    num_subsets: Annotated[int, typer.Option("--num_subsets", "--num-subsets")] = 5,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Split a dataset into subset_<i>.parquet files, contiguous and of near-equal size."""
    data = resolve_config(config, set_).data
    with _user_errors_exit():
        report = split_dataset(
            dataset, output_dir, num_subsets, data.split, data.field_map, data.skip_bad_rows
        )
    typer.echo(f"{report.source}: {sum(report.sizes)} problems ({report.format_name} format)")
    for path, size in zip(report.paths, report.sizes, strict=True):
        typer.echo(f"  {path}: {size} problems")
    for row in report.skipped_rows:
        typer.echo(f"  skipped {row}")


@offline_values_app.command("estimate")
def estimate(
    data_file: Annotated[
        str, typer.Option("--data_file", "--data-file", help="a subset written by split")
    ],
    model_path: Annotated[
        str, typer.Option("--model_path", "--model-path", help="HF dir, Hub name, builtin:tiny")
    ],
    output_dir: Annotated[Path, typer.Option("--output_dir", "--output-dir")] = Path("."),
    n_samples: Annotated[
        int, typer.Option("--n_samples", "--n-samples", help="samples per problem (n0)")
    ] = 8,
    exp_name: Annotated[
        str | None,
        typer.Option(
            "--exp_name",
            "--exp-name",
            help="results go to OUTPUT_DIR/EXP_NAME/validation_data/0.jsonl; default "
            "offline_value_estimation_subset_<i> for a subset_<i> file",
        ),
    ] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster address (default $RAY_ADDRESS, else local)")
    ] = None,
    chunk_size: Annotated[
        int, typer.Option("--chunk_size", "--chunk-size", help="prompts sent per round")
    ] = 256,
) -> None:
    """Sample N responses per problem with the base model and score them with the reward."""
    from satseq.models import ModelLoadError  # here, not at the top: it imports torch

    resolved = resolve_config(config, set_)

    def show_progress(done: int, total: int, mean_score: float) -> None:
        typer.echo(f"  {done}/{total} prompts, mean score {mean_score:.4f}")

    with _user_errors_exit(ModelLoadError):
        report = estimate_offline_values(
            data_file,
            model_path,
            output_dir,
            n_samples,
            exp_name,
            resolved,
            address,
            chunk_size,
            show_progress,
        )
    typer.echo("\n".join(report.summary_lines()))


@offline_values_app.command("merge")
def merge(
    input_dir: Annotated[
        Path, typer.Option("--input_dir", "--input-dir", help="the estimate --output_dir")
    ],
    output_file: Annotated[
        Path, typer.Option("--output_file", "--output-file", help="JSON {prompt: list of scores}")
    ],
    pattern: Annotated[
        str, typer.Option(help="glob of the results files under INPUT_DIR")
    ] = DEFAULT_RESULTS_PATTERN,
    max_scores_per_prompt: Annotated[
        int,
        typer.Option(
            "--max_scores_per_prompt", "--max-scores-per-prompt", help="n0: the cap per prompt"
        ),
    ] = 8,
    seed: Annotated[int, typer.Option(help="seed of the subsampling to the cap")] = 0,
    dataset: Annotated[
        str | None,
        typer.Option(help="report the prompts of this dataset that have no scores"),
    ] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Merge the estimate results into JSON {prompt: scores}, with statistics and warnings."""
    data = resolve_config(config, set_).data
    with _user_errors_exit():
        report = merge_offline_values(
            input_dir,
            output_file,
            pattern,
            max_scores_per_prompt,
            seed,
            dataset,
            data.split,
            data.field_map,
            data.skip_bad_rows,
        )
    typer.echo(f"merged {len(report.files)} files into {output_file}")
    typer.echo("\n".join(report.summary_lines()))
