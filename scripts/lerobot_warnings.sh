# Sourced by the compat scripts. `data_warnings STDERR`: what a LeRobot oracle printed on stderr
# about the data (LeRobot's log lines, e.g. "Unknown fields in DatasetInfo: [...]" from 0.6), that
# is every line except the Python warnings torchvision raises about the oracle venv's own build
# (its image extension, its video API's deprecation) with their source-line continuations, and
# HF datasets' progress bars ("Generating train split: 69 examples [00:00, 11799.53 examples/s]").
# Prints nothing for a clean load.
data_warnings() {
  awk '
    /\/site-packages\/torchvision\/[^:]*:[0-9]+: [A-Za-z]*Warning:/ { skip = 1; next }
    skip && /^  (warn|warnings\.warn)\(/ { skip = 0; next }
    /^[[:space:]]*$/ { next }
    /\[[0-9:]+(<[0-9:?]+)?, [^]]*\/s\]$/ { next }
    { skip = 0; print }
  ' <<<"$1"
}
