"""upload stage of the eva dataflow."""
