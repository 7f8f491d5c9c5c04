"""export stage of the eva dataflow."""
