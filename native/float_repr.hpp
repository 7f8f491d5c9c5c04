// Python's repr of doubles, for JSON written as json.dumps writes it (docs/formats.md, the
// foxglove MCAP profile). The Python references are in eva/formats/mcap/json_rows.py
// (``repr(float(v))``, ``json.dumps``); the tests compare them on random bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eva {

// Longest repr of a finite double: "-" + 17 digits + "." + "e-308" and the like.
constexpr std::size_t FLOAT_REPR_MAX = 32;

// Write repr(v) of each finite value back to back into `out` (room for n * FLOAT_REPR_MAX
// bytes) and its length into `lengths`; return the bytes written. The digits are the shortest
// that read back as the same double (std::to_chars); the layout is Python's: positional for
// decimal exponents -4..15 with ".0" on whole numbers, else d.ddde+XX. NaN and infinity are
// written "nan", "inf", "-inf".
std::size_t float_repr(const double* values, std::size_t n, char* out, std::int64_t* lengths);

// JSON objects of `rows` rows of `columns` doubles (row-major): row i is keys[0], repr(v[i][0]),
// keys[1], repr(v[i][1]), ..., then "}", where key j is keys[key_ends[j-1]:key_ends[j]] (the
// caller's `{"name": ` / `, "name": `) and a NaN or infinity is written `null` (as eva's
// json_payload writes it). `out` has room for rows * (key bytes + columns * FLOAT_REPR_MAX + 1).
// Writes each row's length into `lengths`; returns the bytes written.
std::size_t float_objects(const double* values, std::size_t rows, std::size_t columns,
                          const char* keys, const std::int64_t* key_ends, char* out,
                          std::int64_t* lengths);

}  // namespace eva
