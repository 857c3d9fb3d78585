"""The course's trained model(s) and the script that trains them (``make model``)."""
