"""The n-gram tier's telemetry: counters it adds and the `ngram` section of a snapshot."""
from __future__ import annotations

NGRAM_COUNTERS = frozenset({
    "ngram_tokens",         # tokens whose rows were looked up
    "ngram_rows",           # distinct rows a step needed, summed over steps and PLE layers
    "ngram_hits", "ngram_misses",               # of those rows, in the RAM cache or read
    "ngram_reads", "ngram_bytes_read",          # reads issued (pages coalesced) and their bytes
    "ngram_bytes_used",                         # the bytes of the rows those reads were for
    "ngram_cache_bytes", "ngram_read_s",
    "ngram_held",           # 1 where the whole tables are held in RAM (cache_bytes is then theirs)
    "ngram_held_read_bytes",    # of those, the bytes the background read has brought in so far
    "ngram_wait_s",         # what the layers' host waited for rows: the reads the earlier layers did not hide
})


def ngram_section(v: dict) -> dict:
    """rows / bytes a token, hit rate, read amplification (bytes read / bytes used)."""
    tokens, looked_up = v["ngram_tokens"], v["ngram_hits"] + v["ngram_misses"]
    per_token = lambda key: v[key] / tokens if tokens else 0.0          # noqa: E731
    return {"tokens": int(tokens), "rows": int(v["ngram_rows"]), "hits": int(v["ngram_hits"]),
            "misses": int(v["ngram_misses"]), "reads": int(v["ngram_reads"]),
            "bytes_read": int(v["ngram_bytes_read"]), "bytes_used": int(v["ngram_bytes_used"]),
            "cache_bytes": int(v["ngram_cache_bytes"]), "held": bool(v["ngram_held"]),
            "held_read_bytes": int(v["ngram_held_read_bytes"]), "read_s": v["ngram_read_s"],
            "wait_s": v["ngram_wait_s"],
            "rows_per_token": per_token("ngram_rows"), "bytes_per_token": per_token("ngram_bytes_read"),
            "hit_rate": v["ngram_hits"] / looked_up if looked_up else 0.0,
            "read_amplification": v["ngram_bytes_read"] / v["ngram_bytes_used"] if v["ngram_bytes_used"] else 0.0}
