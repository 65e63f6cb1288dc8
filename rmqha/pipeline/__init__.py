"""
The data pipeline on Spark: commit logs as DataFrames (the
C{rocketmq-commitlog} Python data source), and the C{rmqha pipeline} jobs
C{stats}, C{export} and C{verify}.

L{rmqha.pipeline.scan} plans and decodes without Spark (the data source
runs the same code in each task); L{rmqha.pipeline.source} wraps it as a
PySpark data source; L{rmqha.pipeline.jobs} holds the jobs.  Needs
C{pip install 'rmqha[spark]'} and Java 17.
"""
