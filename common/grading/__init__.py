"""The course tooling instructors run: the grader, its pytest points plugin, the student
release, the Gradescope autograder and the mutation check of the specs.

    python -m common.grading            # make grade
    python -m common.grading.release    # make release OUT=dir
    python -m common.grading.autograder # make autograder
    python -m common.grading.mutants    # make mutants
"""
