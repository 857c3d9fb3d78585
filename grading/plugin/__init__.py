"""What runs inside each lab's pytest process, the trusted one: the points plugin, the time
limits, readable messages, and the proxy of the graded module (its calls go to a sandboxed
worker).
"""
