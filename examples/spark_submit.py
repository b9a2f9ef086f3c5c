"""Run an mvsink job file under spark-submit, which then owns the master and the resources.

    spark-submit --master 'local[2]' examples/spark_submit.py conf/demo.toml

spark-submit's ``--master`` and ``--conf`` (and ``spark-defaults.conf``) win: the job file's
``[spark]`` table only fills in the settings they leave unset.
"""

import sys

from mvsink.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
