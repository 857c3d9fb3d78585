"""The grader: ``python -m grading`` (``make grade``) and the tools around it.

    python -m grading                       # make grade        (run/cli.py)
    python -m grading.tools.release         # make release OUT=dir
    python -m grading.tools.autograder      # make autograder
    python -m grading.tools.mutants         # make mutants

Cut by the process that runs the code (``grading/README.md`` has every module's job):

    run/      the grading run: labs, one pytest process per lab, the report, results.json
    plugin/   inside each lab's pytest process: points, time limits, the graded module's proxy
    sandbox/  the wire, the sandbox from the trusted side, and the zygote and worker inside it
    tools/    the instructors' commands: the student release, the autograder, the mutants
"""
