"""The sandbox: the wire between the trusted side and the graded code, the sandbox as the
trusted side sets it up (scratch copy, uids, zygotes), and the code that runs inside it. A
scratch copy holds this package and ``common``, nothing else of the grader.
"""
