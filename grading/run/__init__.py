"""The grading run (``python -m grading``): which labs, one pytest process per lab under
time and size limits, grading a lab through crashes and hangs, the report and results.json.
"""
