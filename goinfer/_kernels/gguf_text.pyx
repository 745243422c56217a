# cython: language_level=3, boundscheck=False, wraparound=False
"""GGUF string arrays at C speed (goinfer/gguf.py): a model's vocabulary and merges are up to
~400k length-prefixed strings, which a Python loop reads in ~0.3 s at every load."""
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memcpy


def string_array(const unsigned char[::1] buf, Py_ssize_t offset, Py_ssize_t n):
    """n strings, each a little-endian u64 byte length then that many UTF-8 bytes, from byte
    `offset` of buf -> (list of str, offset just past the last one).  EOFError if one runs past
    the end of buf; UnicodeDecodeError if one is not valid UTF-8.  (Little-endian hosts.)"""
    cdef Py_ssize_t size = buf.shape[0]
    cdef Py_ssize_t i, o = offset
    cdef uint64_t slen
    if offset < 0 or n < 0:
        raise ValueError("negative offset or count")
    out = [None] * n
    for i in range(n):
        if o > size - 8:
            raise EOFError(f"string array element {i} at offset {o} past end of file")
        memcpy(&slen, &buf[o], 8)
        if slen > <uint64_t>(size - o - 8):
            raise EOFError(f"string of {slen} bytes at offset {o} past end of file")
        out[i] = PyUnicode_DecodeUTF8(<const char *>&buf[o] + 8, <Py_ssize_t>slen, NULL)
        o += 8 + <Py_ssize_t>slen
    return out, o
