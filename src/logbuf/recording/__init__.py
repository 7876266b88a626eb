"""The recording format: what ``logbuf record`` and ``logbuf scenario`` write and ``logbuf analyze`` reads.

    schema   the format (datasets, columns, partitions, crash-safe file convention) and its checks
    reader   the format marker and the complete files of a dataset
    writer   DatasetWriter / RecordingWriter: rolling, partitioned, ``.tmp`` -> rename

A layer of its own below the recorder and the pipeline (both use it; it imports neither).  Importing this
package imports nothing heavy; pyarrow loads with ``schema``.
"""

DEFAULT_ROWS_PER_FILE = 16_000_000  # rows after which a writer completes a file
DEFAULT_ROW_GROUP_ROWS = 1_000_000  # Parquet row group size
