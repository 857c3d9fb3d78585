"""The instructors' commands: the student release (and its leak check), the Gradescope
autograder, and the planted mistakes of ``make mutants``.
"""
