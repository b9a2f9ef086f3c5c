"""Fail in one clear line when no Java 17+ is on PATH (Spark needs it)."""

import re
import shutil
import subprocess
import sys

HINT = "install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless) and retry"

java = shutil.which("java")
if java is None:
    sys.exit(f"mvsink: Java not found: Spark needs Java 17 or newer; {HINT}")
out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
major = int(m.group(1)) if m else 0
if major == 1 and m and m.group(2):
    major = int(m.group(2))
if major < 17:
    sys.exit(f"mvsink: Java {major or '?'} found at {java}, but Spark needs Java 17 or newer; {HINT}")
