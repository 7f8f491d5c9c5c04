"""quality stage of the eva dataflow."""
