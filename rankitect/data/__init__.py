"""rankitect.data: feature specs, the cached data format, readers and batches.

>>> from rankitect.data import open_data, describe  # the usual entry points
"""

from rankitect.data.batch import Batch, make_batch
from rankitect.data.criteo import read_criteo
from rankitect.data.sources import DataOptions, describe, open_data
from rankitect.data.spec import DenseFeature, FeatureSpec, SparseFeature
from rankitect.data.clickdata import ClickData, Split
from rankitect.data.store import StoreWriter, data_cache_root
from rankitect.data.synthetic import default_data_dir, ensure_default_data, generate_synthetic
from rankitect.data.tabular import read_tabular

__all__ = [
    "Batch", "ClickData", "DataOptions", "DenseFeature", "FeatureSpec", "Split", "SparseFeature", "StoreWriter",
    "data_cache_root", "default_data_dir", "describe", "ensure_default_data", "generate_synthetic", "make_batch",
    "open_data", "read_criteo", "read_tabular",
]
