/* The per-record walks of a record batch's zone (codec_batch.py, TLE2) in C.
 *
 * Fast paths only: each function takes exactly the zones the Python function of the same
 * name takes and returns the same result for them; for anything else it returns None, and
 * codec_batch runs its Python code, which names the problem (CorruptEntry) or, should this
 * code be stricter somewhere, gives the result itself. So the layout and every rule stay in
 * codec.py / codec_batch.py, and tests/unit/test_zonewalk.py holds the two to the same
 * answers on valid and damaged zones.
 *
 * index_put is key_index's loop (IndexFile._put_loop) the same way: its Python code is the rule
 * and the fallback, and tests/unit/test_key_index_vector.py holds the writers to the same bytes.
 *
 * Why: at W=256 these loops ran on every replica for every message (a leader checking a
 * SEND_ZONE, a follower checking what it appends, each dispatcher reading the ids), ~0.4 us a
 * record each in Python; and a producer encodes every message it sends (~1 us a record).
 *
 * Zone layout (codec.py): attributes u16 | count u16 | queue_id u32 | topic_len u8 | topic,
 * then `count` records: record_size u32 | flags u32 | born_ts_ms u64 | msg_id 16 |
 * props_len u16 | body_len u32 | props | body, big-endian.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define ZONE_TOPIC_AT 9
#define RECORD_SIZE 38
#define MSG_ID_AT 16
#define MSG_ID_SIZE 16
#define PROPS_LEN_AT 32
#define BODY_LEN_AT 34
#define PROPS_BYTES_MAX 32767
#define TOPIC_BYTES_MAX 127
#define INDEX_HEADER_SIZE 40  /* key_index.HEADER */
#define INDEX_ENTRY_SIZE 20  /* key_index.ENTRY */

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint16_t be16(const unsigned char *p) {
    return (uint16_t)((p[0] << 8) | p[1]);
}

/* codec_batch.frame_records' rules on the zone z[0:zsize]: the zone head holds
 * (_zone_head_problem), every record's size is RECORD_SIZE + props_len + body_len, none runs
 * past the zone, props_len <= PROPS_BYTES_MAX, and the records end exactly at the zone's end.
 * 1 if they hold, 0 if not, -1 on a Python error. `bodies` (may be NULL): set to a new list
 * of the records' body lengths when they hold; `props_max`: the largest props_len. */
static int zone_walk(const unsigned char *z, Py_ssize_t zsize, PyObject **bodies, long *props_max) {
    if (zsize < ZONE_TOPIC_AT)
        return 0;
    unsigned attributes = be16(z), count = be16(z + 2), topic_len = z[8];
    if (attributes != 0 || count == 0 || topic_len < 1 || topic_len > TOPIC_BYTES_MAX)
        return 0;
    if (ZONE_TOPIC_AT + (Py_ssize_t)topic_len + (Py_ssize_t)count * RECORD_SIZE > zsize)
        return 0;
    PyObject *list = NULL;
    if (bodies != NULL && (list = PyList_New(count)) == NULL)
        return -1;
    Py_ssize_t rel = ZONE_TOPIC_AT + topic_len;
    long pmax = 0;
    for (unsigned k = 0; k < count; k++) {
        if (rel + RECORD_SIZE > zsize)
            goto no;
        const unsigned char *r = z + rel;
        uint64_t size = be32(r), plen = be16(r + PROPS_LEN_AT), blen = be32(r + BODY_LEN_AT);
        if (size != RECORD_SIZE + plen + blen || rel + (Py_ssize_t)size > zsize || plen > PROPS_BYTES_MAX)
            goto no;
        if (list != NULL) {
            PyObject *b = PyLong_FromUnsignedLongLong(blen);
            if (b == NULL) {
                Py_DECREF(list);
                return -1;
            }
            PyList_SET_ITEM(list, k, b);
        }
        if ((long)plen > pmax)
            pmax = (long)plen;
        rel += (Py_ssize_t)size;
    }
    if (rel != zsize)
        goto no;
    if (bodies != NULL)
        *bodies = list;
    if (props_max != NULL)
        *props_max = pmax;
    return 1;
no:
    Py_XDECREF(list);
    return 0;
}

/* frame_records(zone, pos, end) -> (body lengths, largest props_len) | None: codec_batch.
 * frame_records (zone_walk's rules) on zone[pos:end]. `end` < 0: the buffer's end. */
static PyObject *frame_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &pos, &end))
        return NULL;
    if (end < 0)
        end = view.len;
    PyObject *bodies = NULL;
    long props_max = 0;
    int ok = 0;
    if (pos >= 0 && pos <= end && end <= view.len)
        ok = zone_walk((const unsigned char *)view.buf + pos, end - pos, &bodies, &props_max);
    PyBuffer_Release(&view);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(Nl)", bodies, props_max);
}

/* The raft follower's steady state (replication/raft/lane.py), the part that reads bytes.
 *
 * follower_pushes(buf, start, end, term, leader, probe_seq, next_index, last_term, tail,
 *                 seg_end, frame_max) -> (consumed, raws, places, terms, pushes) | None
 *
 * Takes the whole frames at buf[start:end], in order, while each is a oneway RAFT frame of
 * this protocol version with no header map (broker/protocol/frame.py) whose body is a Push
 * (replication/raft/wire.py) of `term` from `leader`, type APPEND, seq >= probe_seq, with
 * entries that continue the log exactly: the first at next_index and each the next, each a
 * TLE2 entry that codec_batch.check_entry accepts (framing, both CRCs, the records' framing,
 * a UTF-8 topic) naming the wire's index and term, a term not below the one before it, and
 * the offset CommitLog._place gives it from `tail` without leaving the current segment
 * (which ends at seg_end). It stops before the first frame that is anything else -- a
 * partial one, a probe, a gap, a roll, a damaged entry -- and leaves that frame and the rest
 * to the Python path, which takes or refuses them by its own rules (this code is only ever
 * stricter). Returns None when not even the first frame is taken; else the bytes taken, each
 * entry's bytes (copies), offsets and terms, and (seq, commit_index, last index) per frame.
 */
#define FRAME_HEADER 16
#define FRAME_MAGIC 0x544C
#define FRAME_VERSION 1
#define FLAG_ONEWAY 0x02
#define REQ_RAFT 100
#define KIND_PUSH 3
#define PUSH_APPEND 1
#define TERM_MAX (1ULL << 62)
#define INDEX_MAX (1LL << 62)
#define BATCH_MAGIC 0x544C4532u
#define BATCH_HEAD_SIZE 56
#define HEAD_CRC_START 12
#define BATCH_SIZE_MIN (BATCH_HEAD_SIZE + ZONE_TOPIC_AT + 1 + RECORD_SIZE)
#define BLANK_SIZE_MIN 8

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static int utf8_ok(const unsigned char *p, Py_ssize_t n) {
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(s);
    return 1;
}

/* One frame at f (avail bytes there): its size if it is taken, else 0. `expect`, `last_term`
 * and `pos` advance past its entries; *seq, *commit, *count are the push's. */
static Py_ssize_t push_frame(const unsigned char *f, Py_ssize_t avail, uint64_t term,
                             const unsigned char *leader, Py_ssize_t leader_len, uint64_t probe_seq,
                             int64_t *expect, uint64_t *last_term, int64_t *pos, int64_t seg_end,
                             Py_ssize_t frame_max, uint64_t *seq, int64_t *commit, uint32_t *count) {
    if (avail < FRAME_HEADER)
        return 0;
    Py_ssize_t size = be32(f);
    if (size > avail || size > frame_max || size < FRAME_HEADER || be16(f + 4) != FRAME_MAGIC
            || f[6] != FRAME_VERSION || f[7] != FLAG_ONEWAY || be16(f + 8) != REQ_RAFT || be16(f + 14) != 0)
        return 0;
    const unsigned char *b = f + FRAME_HEADER, *end = f + size;
    if (end - b < 10 || b[0] != KIND_PUSH || be64(b + 1) != term || b[9] != leader_len)
        return 0;
    const unsigned char *p = b + 10;
    if (end - p < leader_len + 21 || memcmp(p, leader, leader_len) != 0)
        return 0;
    p += leader_len;
    int64_t c = (int64_t)be64(p + 1);
    uint64_t s = be64(p + 9);
    uint32_t n_entries = be32(p + 17);
    if (p[0] != PUSH_APPEND || c < -1 || c > INDEX_MAX || s < probe_seq || n_entries == 0)
        return 0;
    p += 21;
    int64_t want = *expect, at = *pos;
    uint64_t lt = *last_term;
    for (uint32_t k = 0; k < n_entries; k++) {
        if (end - p < 20)
            return 0;
        int64_t index = (int64_t)be64(p);
        uint64_t eterm = be64(p + 8);
        Py_ssize_t n = be32(p + 16);
        p += 20;
        if (index != want || eterm > TERM_MAX || n > end - p || n < BATCH_SIZE_MIN)
            return 0;
        const unsigned char *e = p;
        if ((Py_ssize_t)be32(e) != n || be32(e + 4) != BATCH_MAGIC)
            return 0;
        if ((int64_t)be64(e + 12) != index || be64(e + 20) != eterm || eterm < lt)
            return 0;
        if (at + n + BLANK_SIZE_MIN > seg_end || (int64_t)be64(e + 28) != at)
            return 0;
        if (crc32(0L, e + HEAD_CRC_START, BATCH_HEAD_SIZE - HEAD_CRC_START) != be32(e + 8))
            return 0;
        if (crc32(0L, e + BATCH_HEAD_SIZE, (uInt)(n - BATCH_HEAD_SIZE)) != be32(e + 52))
            return 0;
        if (zone_walk(e + BATCH_HEAD_SIZE, n - BATCH_HEAD_SIZE, NULL, NULL) != 1
                || !utf8_ok(e + BATCH_HEAD_SIZE + ZONE_TOPIC_AT, e[BATCH_HEAD_SIZE + 8]))
            return 0;
        p += n;
        at += n;
        want++;
        lt = eterm;
    }
    if (p != end)
        return 0;
    *expect = want;
    *last_term = lt;
    *pos = at;
    *seq = s;
    *commit = c;
    *count = n_entries;
    return size;
}

static PyObject *follower_pushes(PyObject *self, PyObject *args) {
    Py_buffer view, lead;
    Py_ssize_t start, end, frame_max;
    unsigned long long term, probe_seq, last_term;
    long long next_index, tail, seg_end;
    if (!PyArg_ParseTuple(args, "y*nnKy*KLKLLn", &view, &start, &end, &term, &lead, &probe_seq,
                          &next_index, &last_term, &tail, &seg_end, &frame_max))
        return NULL;
    PyObject *raws = NULL, *places = NULL, *terms = NULL, *pushes = NULL, *out = Py_None;
    Py_INCREF(out);
    if (start < 0 || end > view.len || start > end)
        goto done;
    Py_DECREF(out);
    out = NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t at = start;
    int64_t expect = next_index, pos = tail;
    uint64_t lt = last_term;
    if (!(raws = PyList_New(0)) || !(places = PyList_New(0)) || !(terms = PyList_New(0)) || !(pushes = PyList_New(0)))
        goto fail;
    for (;;) {
        int64_t first = expect, first_pos = pos, commit;
        uint64_t seq;
        uint32_t count;
        Py_ssize_t size = push_frame(buf + at, end - at, term, (const unsigned char *)lead.buf, lead.len,
                                     probe_seq, &expect, &lt, &pos, seg_end, frame_max, &seq, &commit, &count);
        if (size == 0)
            break;
        /* taken: its entries' bytes, offsets and terms (the checks above passed on all of them) */
        const unsigned char *p = buf + at + FRAME_HEADER + 10 + lead.len + 21;
        int64_t place = first_pos;
        for (uint32_t k = 0; k < count; k++) {
            Py_ssize_t n = be32(p + 16);
            PyObject *raw = PyBytes_FromStringAndSize((const char *)p + 20, n);
            PyObject *off = raw ? PyLong_FromLongLong(place) : NULL;
            PyObject *t = off ? PyLong_FromUnsignedLongLong(be64(p + 8)) : NULL;
            int bad = t == NULL || PyList_Append(raws, raw) || PyList_Append(places, off) || PyList_Append(terms, t);
            Py_XDECREF(raw);
            Py_XDECREF(off);
            Py_XDECREF(t);
            if (bad)
                goto fail;
            place += n;
            p += 20 + n;
        }
        PyObject *one = Py_BuildValue("(KLL)", (unsigned long long)seq, (long long)commit,
                                      (long long)(first + count - 1));
        if (one == NULL || PyList_Append(pushes, one)) {
            Py_XDECREF(one);
            goto fail;
        }
        Py_DECREF(one);
        at += size;
    }
    if (at > start)
        out = Py_BuildValue("(nOOOO)", at - start, raws, places, terms, pushes);
    else {
        out = Py_None;
        Py_INCREF(out);
    }
    goto done;
fail:
    out = NULL;
done:
    Py_XDECREF(raws);
    Py_XDECREF(places);
    Py_XDECREF(terms);
    Py_XDECREF(pushes);
    PyBuffer_Release(&view);
    PyBuffer_Release(&lead);
    return out;
}

/* The raft leader's steady-state answers (replication/raft/leader_lane.py LeaderAnswers).
 *
 * leader_answers(buf, start, end, term, frame_max) -> (consumed, src, answers) | None
 *
 * Takes the whole frames at buf[start:end], in order, while each is a oneway RAFT frame as
 * follower_pushes reads them whose body is a PushResponse (replication/raft/wire.py) of
 * `term`, type APPEND, code SUCCESS, with no trailing byte and every number within
 * wire.decode's bounds, all from the sender of the first (`src`: its bytes, which the
 * caller looks up among the members); answers: (index, seq) per frame. Anything else stops
 * it, and is left to the Python path. None: not even the first frame is taken. */
#define KIND_PUSH_RESPONSE 4
#define PUSH_RESPONSE_BODY 34
#define CODE_SUCCESS 0

static PyObject *leader_answers(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end, frame_max;
    unsigned long long term;
    if (!PyArg_ParseTuple(args, "y*nnKn", &view, &start, &end, &term, &frame_max))
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf, *src = NULL;
    Py_ssize_t src_len = 0, at = start;
    PyObject *answers = NULL, *out = NULL;
    if (start < 0 || end > view.len || start > end)
        goto none;
    if (!(answers = PyList_New(0)))
        goto done;
    while (end - at >= FRAME_HEADER) {
        const unsigned char *f = buf + at;
        Py_ssize_t size = be32(f);
        if (size > end - at || size > frame_max || size < FRAME_HEADER || be16(f + 4) != FRAME_MAGIC
                || f[6] != FRAME_VERSION || f[7] != FLAG_ONEWAY || be16(f + 8) != REQ_RAFT || be16(f + 14) != 0)
            break;
        const unsigned char *b = f + FRAME_HEADER;
        Py_ssize_t sl;
        if (size - FRAME_HEADER < 10 || b[0] != KIND_PUSH_RESPONSE || be64(b + 1) != term
                || size - FRAME_HEADER != 10 + (sl = b[9]) + PUSH_RESPONSE_BODY)
            break;
        if (src == NULL) {
            src = b + 10;
            src_len = sl;
        } else if (sl != src_len || memcmp(b + 10, src, sl) != 0)
            break;
        const unsigned char *p = b + 10 + sl;
        int64_t index = (int64_t)be64(p + 2), begin = (int64_t)be64(p + 10), last = (int64_t)be64(p + 18);
        if (p[0] != PUSH_APPEND || p[1] != CODE_SUCCESS || index < -1 || index > INDEX_MAX
                || begin < -1 || begin > INDEX_MAX || last < -1 || last > INDEX_MAX)
            break;
        PyObject *one = Py_BuildValue("(LK)", (long long)index, (unsigned long long)be64(p + 26));
        if (one == NULL || PyList_Append(answers, one)) {
            Py_XDECREF(one);
            goto done;
        }
        Py_DECREF(one);
        at += size;
    }
    if (at > start) {
        out = Py_BuildValue("(ny#O)", at - start, (const char *)src, src_len, answers);
        goto done;
    }
none:
    out = Py_None;
    Py_INCREF(out);
done:
    Py_XDECREF(answers);
    PyBuffer_Release(&view);
    return out;
}

/* record_ids(zone, pos, end, hash_seed) -> (ids, props) | None.
 * codec_batch.record_ids: each record's msg_id (or, with hash_seed >= 0, the CRC-32 of it
 * continued from hash_seed, key_index.id_hash's value) and the OR of their props_len, walking
 * by record_size from after the topic; a record head past the buffer, or records that do not
 * end exactly at `end`, is not this path's to judge. */
static PyObject *record_ids(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, end;
    long long seed;
    if (!PyArg_ParseTuple(args, "y*nnL", &view, &pos, &end, &seed))
        return NULL;
    const unsigned char *z = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    PyObject *ids = NULL;
    if (pos < 0 || pos + ZONE_TOPIC_AT > len)
        goto none;
    unsigned count = be16(z + pos + 2), topic_len = z[pos + 8];
    ids = PyList_New(count);
    if (ids == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t p = pos + ZONE_TOPIC_AT + topic_len;
    unsigned long props = 0;
    for (unsigned k = 0; k < count; k++) {
        if (p < 0 || p + RECORD_SIZE > len)
            goto none;
        const unsigned char *r = z + p;
        PyObject *v;
        if (seed >= 0)
            v = PyLong_FromUnsignedLong(crc32((uLong)seed, r + MSG_ID_AT, MSG_ID_SIZE));
        else
            v = PyBytes_FromStringAndSize((const char *)(r + MSG_ID_AT), MSG_ID_SIZE);
        if (v == NULL) {
            Py_DECREF(ids);
            PyBuffer_Release(&view);
            return NULL;
        }
        PyList_SET_ITEM(ids, k, v);
        props |= be16(r + PROPS_LEN_AT);
        p += (Py_ssize_t)be32(r);
    }
    if (p != end)
        goto none;
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nk)", ids, props);
none:
    Py_XDECREF(ids);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v;
}

/* encode_zone(topic, queue_id, records[, with_crc]) -> (zone, records_crc) | None.
 * codec_batch.encode_zone for a topic given as bytes and records given as 5-item tuples or
 * lists (flags, born_ts_ms, msg_id, properties, body) of ints and bytes: the zone head, then
 * each record's head, properties and body, and the CRC-32 of it all (with_crc false: None in
 * its place, the caller computes it with a faster CRC). None for anything else or anything
 * out of the layout's range: the Python code then raises BatchLimitError naming it. */
static PyObject *encode_zone(PyObject *self, PyObject *args) {
    PyObject *topic, *records;
    unsigned long long queue_id;
    int with_crc = 1;
    if (!PyArg_ParseTuple(args, "SKO|p", &topic, &queue_id, &records, &with_crc))
        return NULL;
    if (!PyList_CheckExact(records) && !PyTuple_CheckExact(records))
        Py_RETURN_NONE;
    Py_ssize_t tlen = PyBytes_GET_SIZE(topic), count = PySequence_Fast_GET_SIZE(records);
    PyObject **items = PySequence_Fast_ITEMS(records);
    if (tlen < 1 || tlen > TOPIC_BYTES_MAX || queue_id > 0xFFFFFFFFULL || count < 1 || count > 0xFFFF)
        Py_RETURN_NONE;
    Py_ssize_t total = ZONE_TOPIC_AT + tlen;
    for (Py_ssize_t k = 0; k < count; k++) {  /* check every record and size the zone first */
        PyObject *r = items[k];
        if (!(PyTuple_CheckExact(r) || PyList_CheckExact(r)) || PySequence_Fast_GET_SIZE(r) != 5)
            Py_RETURN_NONE;
        PyObject **f = PySequence_Fast_ITEMS(r);
        if (!PyLong_CheckExact(f[0]) || !PyLong_CheckExact(f[1]) || !PyBytes_CheckExact(f[2])
                || !PyBytes_CheckExact(f[3]) || !PyBytes_CheckExact(f[4]))
            Py_RETURN_NONE;
        Py_ssize_t plen = PyBytes_GET_SIZE(f[3]), blen = PyBytes_GET_SIZE(f[4]);
        if (PyBytes_GET_SIZE(f[2]) != MSG_ID_SIZE || plen > PROPS_BYTES_MAX
                || (unsigned long long)blen > 0xFFFFFFFFULL - RECORD_SIZE - (unsigned long long)plen)
            Py_RETURN_NONE;
        total += RECORD_SIZE + plen + blen;
    }
    if ((unsigned long long)total > 0xFFFFFFFFULL)  /* crc32() takes 32-bit lengths */
        Py_RETURN_NONE;
    PyObject *zone = PyBytes_FromStringAndSize(NULL, total);
    if (zone == NULL)
        return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(zone);
    put16(out, 0);
    put16(out + 2, (unsigned)count);
    put32(out + 4, (uint32_t)queue_id);
    out[8] = (unsigned char)tlen;
    memcpy(out + ZONE_TOPIC_AT, PyBytes_AS_STRING(topic), tlen);
    unsigned char *w = out + ZONE_TOPIC_AT + tlen;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject **f = PySequence_Fast_ITEMS(items[k]);
        unsigned long long flags = PyLong_AsUnsignedLongLong(f[0]), born = PyLong_AsUnsignedLongLong(f[1]);
        if ((flags == (unsigned long long)-1 || born == (unsigned long long)-1) && PyErr_Occurred()) {
            PyErr_Clear();  /* negative or too big: not this path's to name */
            Py_DECREF(zone);
            Py_RETURN_NONE;
        }
        if (flags > 0xFFFFFFFFULL) {
            Py_DECREF(zone);
            Py_RETURN_NONE;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(f[3]), blen = PyBytes_GET_SIZE(f[4]);
        put32(w, (uint32_t)(RECORD_SIZE + plen + blen));
        put32(w + 4, (uint32_t)flags);
        put32(w + 8, (uint32_t)(born >> 32));
        put32(w + 12, (uint32_t)born);
        memcpy(w + MSG_ID_AT, PyBytes_AS_STRING(f[2]), MSG_ID_SIZE);
        put16(w + PROPS_LEN_AT, (unsigned)plen);
        put32(w + BODY_LEN_AT, (uint32_t)blen);
        memcpy(w + RECORD_SIZE, PyBytes_AS_STRING(f[3]), plen);
        memcpy(w + RECORD_SIZE + plen, PyBytes_AS_STRING(f[4]), blen);
        w += RECORD_SIZE + plen + blen;
    }
    if (!with_crc)
        return Py_BuildValue("(NO)", zone, Py_None);
    uLong crc = crc32(0L, out, (uInt)total);
    return Py_BuildValue("(Nk)", zone, crc);
}

/* index_put(mm, hashes, start, end, phys, diff, slots, entries_at, count) -> True | None.
 * key_index.IndexFile._put_loop: for hashes[start:end] (a list of ints < 2**32) the entries
 * key_hash u32 | phys u64 | diff u32 | prev u32 from byte entries_at + count * 20 on, each
 * chained to its slot's newest entry (prev), the slot then pointing at it (1-based number),
 * into the writable buffer `mm` (the file's mapping). None, with nothing written, for
 * anything the loop would not take as it is (a hash not an int in range, a place past the
 * buffer): the Python code then runs. */
static PyObject *index_put(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *hashes;
    Py_ssize_t start, end, diff, slots, entries_at, count;
    long long phys;
    if (!PyArg_ParseTuple(args, "w*O!nnLnnnn", &view, &PyList_Type, &hashes, &start, &end, &phys,
                          &diff, &slots, &entries_at, &count))
        return NULL;
    unsigned char *mm = (unsigned char *)view.buf;
    Py_ssize_t n = end - start;
    if (start < 0 || n < 0 || end > PyList_GET_SIZE(hashes) || slots < 1 || count < 0
        || phys < 0 || diff < 0 || diff > 0xFFFFFFFFLL || count + n > 0xFFFFFFFFLL
        || INDEX_HEADER_SIZE + slots * 4 > entries_at || entries_at + (count + n) * INDEX_ENTRY_SIZE > view.len)
        goto none;
    for (Py_ssize_t i = start; i < end; i++) {  /* check them all before writing any */
        PyObject *h = PyList_GET_ITEM(hashes, i);
        if (!PyLong_CheckExact(h))
            goto none;
        unsigned long v = PyLong_AsUnsignedLong(h);
        if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > 0xFFFFFFFFUL) {
            PyErr_Clear();
            goto none;
        }
    }
    unsigned char *e = mm + entries_at + count * INDEX_ENTRY_SIZE;
    for (Py_ssize_t i = start; i < end; i++) {
        uint32_t h = (uint32_t)PyLong_AsUnsignedLong(PyList_GET_ITEM(hashes, i));
        unsigned char *slot = mm + INDEX_HEADER_SIZE + (Py_ssize_t)(h % (uint64_t)slots) * 4;
        put32(e, h);
        put32(e + 4, (uint32_t)((unsigned long long)phys >> 32));
        put32(e + 8, (uint32_t)(unsigned long long)phys);
        put32(e + 12, (uint32_t)diff);
        memcpy(e + 16, slot, 4);  /* prev: the slot's value as it is, big-endian both */
        count++;
        put32(slot, (uint32_t)count);
        e += INDEX_ENTRY_SIZE;
    }
    PyBuffer_Release(&view);
    Py_RETURN_TRUE;
none:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_zone", encode_zone, METH_VARARGS, "codec_batch.encode_zone's fast path (None: not this path's input)"},
    {"frame_records", frame_records, METH_VARARGS, "codec_batch.frame_records' fast path (None: not valid here)"},
    {"record_ids", record_ids, METH_VARARGS, "codec_batch.record_ids' fast path (None: not valid here)"},
    {"follower_pushes", follower_pushes, METH_VARARGS, "a raft follower's steady-state APPEND frames, checked (None: none here)"},
    {"leader_answers", leader_answers, METH_VARARGS, "a raft leader's steady-state SUCCESS answers (None: none here)"},
    {"index_put", index_put, METH_VARARGS, "key_index.IndexFile._put_loop's fast path (None: not this path's input)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_zonewalk",
    "The per-record walks of a TLE2 zone in C (fast paths of broker/store/codec_batch.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__zonewalk(void) {
    return PyModule_Create(&module);
}
