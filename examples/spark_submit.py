"""Run an mvsink job file under spark-submit, which then owns the master and the resources.

    spark-submit --master 'local[2]' examples/spark_submit.py conf/demo.toml

The job file's ``[spark] "spark.master"`` is ignored when spark-submit sets one.
"""

import sys

from mvsink.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
