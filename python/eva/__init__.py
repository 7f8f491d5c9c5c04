"""eva: record, review, split, export and upload robot-learning datasets.

The package is laid out like the dataflow: ``capture`` -> ``dataset`` -> ``quality`` ->
``export`` over ``formats`` -> ``publish`` -> ``upload``; ``jobs`` and ``cli`` sit on top.
"""

__version__ = "0.1.0"
