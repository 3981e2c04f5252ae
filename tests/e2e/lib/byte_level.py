"""GPT-2's byte-level symbols, for the end-to-end tests that write a tokenizer.json by hand."""


def byte_vocab():
    """{symbol: byte} for the 256 bytes: the printable ones map to themselves, the rest to
    chr(256 + k) in byte order, as GPT-2's bytes_to_unicode (and tokenizers' ByteLevel) do."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return {chr(c): b for b, c in zip(bs, cs)}
