#include "float_repr.hpp"

#include <charconv>
#include <cmath>
#include <cstring>

namespace eva {

namespace {

std::size_t repr_one(double v, char* out) {
    char* p = out;
    if (std::isnan(v)) {
        std::memcpy(p, "nan", 3);
        return 3;
    }
    if (std::signbit(v)) {
        *p++ = '-';
        v = -v;
    }
    if (std::isinf(v)) {
        std::memcpy(p, "inf", 3);
        return static_cast<std::size_t>(p - out) + 3;
    }
    // Shortest round-trip digits in scientific form: d[.ddd]e(+|-)XX.
    char sci[FLOAT_REPR_MAX];
    auto result = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific);
    char* end = result.ptr;
    char digits[20];
    int ndigits = 0;
    char* q = sci;
    for (; q < end && *q != 'e'; ++q) {
        if (*q != '.') digits[ndigits++] = *q;
    }
    int exponent = 0;
    std::from_chars(q + (q[1] == '+' ? 2 : 1), end, exponent);
    int decpt = exponent + 1;  // the value is 0.DIGITS x 10^decpt
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *p++ = '0';
            *p++ = '.';
            for (int i = 0; i < -decpt; ++i) *p++ = '0';
            std::memcpy(p, digits, ndigits);
            p += ndigits;
        } else if (decpt >= ndigits) {
            std::memcpy(p, digits, ndigits);
            p += ndigits;
            for (int i = ndigits; i < decpt; ++i) *p++ = '0';
            *p++ = '.';
            *p++ = '0';
        } else {
            std::memcpy(p, digits, decpt);
            p += decpt;
            *p++ = '.';
            std::memcpy(p, digits + decpt, ndigits - decpt);
            p += ndigits - decpt;
        }
    } else {
        *p++ = digits[0];
        if (ndigits > 1) {
            *p++ = '.';
            std::memcpy(p, digits + 1, ndigits - 1);
            p += ndigits - 1;
        }
        *p++ = 'e';
        *p++ = exponent < 0 ? '-' : '+';
        int magnitude = exponent < 0 ? -exponent : exponent;
        if (magnitude < 10) *p++ = '0';
        p = std::to_chars(p, p + 4, magnitude).ptr;
    }
    return static_cast<std::size_t>(p - out);
}

}  // namespace

std::size_t float_repr(const double* values, std::size_t n, char* out, std::int64_t* lengths) {
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
        std::size_t written = repr_one(values[i], out + total);
        lengths[i] = static_cast<std::int64_t>(written);
        total += written;
    }
    return total;
}

std::size_t float_objects(const double* values, std::size_t rows, std::size_t columns,
                          const char* keys, const std::int64_t* key_ends, char* out,
                          std::int64_t* lengths) {
    char* p = out;
    for (std::size_t i = 0; i < rows; ++i) {
        char* row = p;
        std::int64_t key_start = 0;
        for (std::size_t j = 0; j < columns; ++j) {
            std::size_t key_size = static_cast<std::size_t>(key_ends[j] - key_start);
            std::memcpy(p, keys + key_start, key_size);
            p += key_size;
            key_start = key_ends[j];
            double v = values[i * columns + j];
            if (std::isfinite(v)) {
                p += repr_one(v, p);
            } else {
                std::memcpy(p, "null", 4);
                p += 4;
            }
        }
        *p++ = '}';
        lengths[i] = static_cast<std::int64_t>(p - row);
    }
    return static_cast<std::size_t>(p - out);
}

}  // namespace eva
