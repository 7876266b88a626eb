"""The PySpark feed-quality pipeline (``logbuf analyze``, ``logbuf scenario``).

    columns     ITCH messages -> the messages dataset's columns (vectorised)
    scenario    a synthetic recording with known faults, and its truth
    spark       Java discovery and the SparkSession (quiet, no UI, bounded memory, reused)
    sources     a recording as Spark DataFrames (any filesystem: local paths, file://, hdfs://, s3a://)
    storage     where analyze reads and writes: a Location (path or URI) through pyarrow.fs; OUT checked early
    host        warnings when the replay or feed handler behind a recording ran late
    arrivals    per-partition numpy worker over the sequence space (delays, gaps, copies)
    quantiles   exact nearest-rank percentiles by histogram refinement
    freezes     head-end freeze detection and catch-up characterisation
    job         the analysis itself (also the spark-submit entry point), plots, report, options, commands

The recording format itself is :mod:`logbuf.recording` (a lower layer).  Importing this package imports
nothing heavy; pyspark, pyarrow and matplotlib load where they are used.
"""
