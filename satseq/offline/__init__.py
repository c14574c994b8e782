"""SPO's offline values (design §4): split a dataset, estimate each subset with the base model,
merge the scores into `{prompt: [scores]}`, and load that file for the value tracker's prior."""

from satseq.offline.estimate import EstimateReport, estimate_offline_values
from satseq.offline.merge import MergeReport, merge_offline_values
from satseq.offline.split import SplitReport, split_dataset
from satseq.offline.values import load_offline_values, write_offline_values

__all__ = [
    "EstimateReport",
    "MergeReport",
    "SplitReport",
    "estimate_offline_values",
    "load_offline_values",
    "merge_offline_values",
    "split_dataset",
    "write_offline_values",
]
