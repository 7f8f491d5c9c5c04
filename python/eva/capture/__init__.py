"""capture stage of the eva dataflow."""
