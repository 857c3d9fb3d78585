"""The course tooling instructors run: the grader, its pytest points plugin, the student
release, the Gradescope autograder and the mutation check of the specs.

    python -m common.grading            # make grade        (cli.py)
    python -m common.grading.release    # make release OUT=dir
    python -m common.grading.autograder # make autograder
    python -m common.grading.mutants    # make mutants

The grader, one module per job, each importing only those above it:

    results.py        TestResult, LabResult, Report: what grading produces
    discovery.py      which labs there are, which test files carry points, --lab choices
    time_limits.py    inside a lab's pytest process: the per-test limit (@given too), watchdog
    messages.py       inside it: an exception as one readable message
    stub.py           inside it: load_impl answering a stub (counting only)
    pytest_points.py  the plugin inside it: one JSON line per event
    runner.py         one lab's pytest process under time and size limits (Options, Run)
    counting.py       a lab's points when its tests cannot be imported (stub, static scan)
    lab.py            grading one lab (crashes, re-runs, hangs) and every lab
    report.py         the terminal table, the reasons, the per-test details
    gradescope.py     results.json: built, validated, written atomically
    cli.py            the command line (``python -m common.grading``)

The student release uses ``leaks.py`` (solution code, recognised as code) and
``student_copy.py`` (the copy's README and Makefile, written for a student). See
``common/README.md``.
"""
