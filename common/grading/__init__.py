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
    collection.py     inside it: skip reasons, fast hypothesis, deselected tests
    pytest_points.py  the plugin inside it: one JSON line per event
    frames.py         what crosses to and from a sandboxed worker: frames with deadlines
    wire_values.py    what crosses: tensors, dtypes, devices, read-only arrays, encoded
    wire.py           what crosses: the pickling rules, the allow-list for results
    leaves.py         what crosses: the arguments a call writes into
    procs.py          finding and killing every process the graded code started
    uids.py           the user switch: a uid block per lab when running as root
    scratch.py        a lab's scratch copy without the tests, its clean environment
    zygote_client.py  the zygotes from the trusted side, the run's warm zygote
    lab_script.py     the LabScript helper: a lab script run in its lab's sandbox
    session.py        around a grading run: mode, uid blocks, locking the tree, sweeping
    sandbox.py        a lab's sandbox: scratch copy, uid block, zygote
    lab_run.py        what one lab's pytest process did (Run), why it stopped
    runner.py         one lab's pytest process under time and size limits (Options)
    confine.py        inside the sandbox: a forked child enters it (uid, limits)
    preimport.py      inside the sandbox: what a zygote imports before it forks
    worker_wire.py    inside the sandbox: the worker's side of the wire
    worker.py         inside the sandbox: the worker, lab scripts
    zygote.py         inside the sandbox: the zygote (forks workers and lab scripts)
    call_limits.py    in the test process: the deadline of a sandboxed call
    remote_errors.py  in it: GradingError (timed out, crashed), the graded code's exceptions
    lab_sandboxes.py  in it: the sandboxes of the process, one per lab
    remote.py         in it: remote functions, objects and classes (what the tests see)
    call_args.py      in it: a call's arguments pickled, writes copied back
    client.py         in it: one lab's worker: calls, deadlines, restarts
    proxy.py          in it: the plugin, load_impl's proxy module
    counting.py       a lab's points when its tests cannot be imported (stub, static scan)
    lab.py            grading one lab (crashes, re-runs, hangs) and every lab
    report.py         the terminal table, the reasons, the per-test details
    gradescope.py     results.json: built, validated, written atomically
    arguments.py      the command line's options, --weight
    cli.py            the command line (``python -m common.grading``)

The student release uses ``release_files.py`` (the project's files, solution files by
name), ``leaks.py`` (solution code, recognised as code) and ``student_copy.py`` (the copy's
README and Makefile, written for a student); the autograder ``submission.py`` (which
submitted file is which lab's). See ``common/README.md``.
"""
