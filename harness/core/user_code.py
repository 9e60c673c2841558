"""Which of the harness's own files stand for a user's code, for both
sides that look for the user's line (the worker's ledger, the parent's
reading of stacks): jobs to try the harness on and the corpus of users'
bugs.  Every other file of the harness is library code there."""

# Paths inside the harness package, "/"-separated; a directory ends in "/".
HARNESS_USER_CODE = ("workloads.py", "bench/corpus/")
