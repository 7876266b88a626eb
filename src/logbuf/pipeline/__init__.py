"""Recording format and the PySpark feed-quality pipeline (``logbuf analyze``, ``logbuf scenario``).

    schema      the recording format (datasets, columns, partitions, crash-safe file convention)
    recording   RecordingWriter (rolling, partitioned, .tmp -> rename) and readers of complete files
    columns     ITCH messages -> the messages dataset's columns (vectorised)
    scenario    a synthetic recording with known faults, and its truth
    spark       Java discovery and the SparkSession (quiet, no UI, bounded memory, reused)
    sources     a recording as Spark DataFrames
    arrivals    per-partition numpy worker over the sequence space (delays, gaps, copies)
    quantiles   exact nearest-rank percentiles by histogram refinement
    freezes     head-end freeze detection and catch-up characterisation
    job         the analysis itself (also the spark-submit entry point), plots, report, options, commands

Importing this package imports nothing heavy; pyspark, pyarrow and matplotlib load where they are used.
"""
