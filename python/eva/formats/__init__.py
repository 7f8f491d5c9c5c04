"""formats stage of the eva dataflow."""
