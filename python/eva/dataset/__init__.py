"""dataset stage of the eva dataflow."""
