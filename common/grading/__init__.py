"""The course tooling instructors run: the grader, its pytest points plugin, the student
release, the Gradescope autograder and the mutation check of the specs.

    python -m common.grading            # make grade        (cli.py)
    python -m common.grading.release    # make release OUT=dir
    python -m common.grading.autograder # make autograder
    python -m common.grading.mutants    # make mutants

The grader, one module per job, each importing only those above it:

    results.py        TestResult, LabResult, Report: what grading produces
    discovery.py      which labs there are, which test files carry points, --lab choices
    runner.py         one lab's pytest process under time and size limits (Options, Run)
    pytest_points.py  the plugin inside that process: one JSON line per event
    counting.py       a lab's points when its tests cannot be imported (stub, static scan)
    lab.py            grading one lab (crashes, re-runs, hangs) and every lab
    report.py         the terminal table, the reasons, the per-test details
    gradescope.py     results.json: built, validated, written atomically
    cli.py            the command line (``python -m common.grading``)
"""
