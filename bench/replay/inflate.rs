//! gzip decompression (RFC 1952 around RFC 1951 deflate) for the replay's `.trace.gz` files,
//! written here so the bench needs no new dependency. Decoding follows zlib's reference decoder
//! `puff`: canonical Huffman codes read one bit at a time (traces are small; speed is ample).
//!
//! Invariant: the output is exactly the compressed data or an error — every member's CRC-32 and
//! length are checked, and a malformed stream (over-subscribed code, distance before the start,
//! truncated input) is an error naming what was wrong, never a panic or a short result.

const MAX_BITS: usize = 15;
const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// The order in which a dynamic block lists its code-length code lengths.
const CLEN_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

type Result<T> = std::result::Result<T, String>;

/// The decompressed bytes of `data`, a gzip file of one or more members.
pub fn gunzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() * 8);
    let mut pos = 0;
    while pos < data.len() {
        let start = out.len();
        pos = member_header(data, pos)?;
        let mut bits = Bits {
            data,
            pos,
            buf: 0,
            count: 0,
        };
        inflate(&mut bits, &mut out)?;
        pos = bits.pos; // the rest of the last byte is padding
        let trailer = data
            .get(pos..pos + 8)
            .ok_or("truncated gzip member (no CRC-32 and length)")?;
        let crc = u32::from_le_bytes(trailer[..4].try_into().unwrap());
        let size = u32::from_le_bytes(trailer[4..].try_into().unwrap());
        if crc32(&out[start..]) != crc {
            return Err("gzip CRC-32 mismatch: the file is corrupt".into());
        }
        if (out.len() - start) as u32 != size {
            return Err("gzip length mismatch: the file is corrupt".into());
        }
        pos += 8;
    }
    Ok(out)
}

/// Skips a member's header at `pos`; returns where its deflate stream starts.
fn member_header(data: &[u8], pos: usize) -> Result<usize> {
    let header = data.get(pos..pos + 10).ok_or("truncated gzip header")?;
    if header[..3] != [0x1f, 0x8b, 8] {
        return Err("not a gzip file (or not deflate-compressed)".into());
    }
    let flags = header[3];
    let mut at = pos + 10;
    if flags & 4 != 0 {
        let len = data.get(at..at + 2).ok_or("truncated gzip extra field")?;
        at += 2 + u16::from_le_bytes([len[0], len[1]]) as usize;
    }
    for flag in [8u8, 16] {
        if flags & flag != 0 {
            let end = data
                .get(at..)
                .and_then(|rest| rest.iter().position(|&b| b == 0))
                .ok_or("truncated gzip name or comment")?;
            at += end + 1;
        }
    }
    if flags & 2 != 0 {
        at += 2;
    }
    match at <= data.len() {
        true => Ok(at),
        false => Err("truncated gzip header".into()),
    }
}

struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
    buf: u32,
    count: u32,
}

impl Bits<'_> {
    fn bits(&mut self, need: u32) -> Result<u32> {
        while self.count < need {
            let byte = *self.data.get(self.pos).ok_or("truncated deflate stream")?;
            self.pos += 1;
            self.buf |= u32::from(byte) << self.count;
            self.count += 8;
        }
        let value = self.buf & ((1u32 << need) - 1);
        self.buf = self.buf.checked_shr(need).unwrap_or(0);
        self.count -= need;
        Ok(value)
    }
}

/// A canonical Huffman code: how many codes of each length, and the symbols in code order.
struct Huffman {
    count: [u16; MAX_BITS + 1],
    symbol: Vec<u16>,
}

impl Huffman {
    fn new(lengths: &[u8]) -> Result<Huffman> {
        let mut count = [0u16; MAX_BITS + 1];
        for &len in lengths {
            count[len as usize] += 1;
        }
        let mut left: i32 = 1;
        for &n in &count[1..] {
            left = (left << 1) - i32::from(n);
            if left < 0 {
                return Err("over-subscribed Huffman code".into());
            }
        }
        let mut offset = [0u16; MAX_BITS + 2];
        for len in 1..=MAX_BITS {
            offset[len + 1] = offset[len] + count[len];
        }
        let mut symbol = vec![0u16; lengths.len()];
        for (sym, &len) in lengths.iter().enumerate() {
            if len != 0 {
                symbol[offset[len as usize] as usize] = sym as u16;
                offset[len as usize] += 1;
            }
        }
        Ok(Huffman { count, symbol })
    }

    fn decode(&self, bits: &mut Bits) -> Result<u16> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for len in 1..=MAX_BITS {
            code |= bits.bits(1)? as i32;
            let count = i32::from(self.count[len]);
            if code - count < first {
                return Ok(self.symbol[(index + code - first) as usize]);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err("invalid Huffman code".into())
    }
}

fn inflate(bits: &mut Bits, out: &mut Vec<u8>) -> Result<()> {
    loop {
        let last = bits.bits(1)? == 1;
        match bits.bits(2)? {
            0 => stored(bits, out)?,
            1 => {
                let (lit, dist) = fixed_codes()?;
                codes(bits, out, &lit, &dist)?;
            }
            2 => {
                let (lit, dist) = dynamic_codes(bits)?;
                codes(bits, out, &lit, &dist)?;
            }
            _ => return Err("invalid deflate block type 3".into()),
        }
        if last {
            return Ok(());
        }
    }
}

fn stored(bits: &mut Bits, out: &mut Vec<u8>) -> Result<()> {
    bits.buf = 0;
    bits.count = 0;
    let at = bits.pos;
    let header = bits.data.get(at..at + 4).ok_or("truncated stored block")?;
    let len = u16::from_le_bytes([header[0], header[1]]);
    let nlen = u16::from_le_bytes([header[2], header[3]]);
    if len != !nlen {
        return Err("stored block length check failed".into());
    }
    let body = bits
        .data
        .get(at + 4..at + 4 + len as usize)
        .ok_or("truncated stored block")?;
    out.extend_from_slice(body);
    bits.pos = at + 4 + len as usize;
    Ok(())
}

fn fixed_codes() -> Result<(Huffman, Huffman)> {
    let mut lengths = [0u8; 288];
    lengths[..144].fill(8);
    lengths[144..256].fill(9);
    lengths[256..280].fill(7);
    lengths[280..].fill(8);
    Ok((Huffman::new(&lengths)?, Huffman::new(&[5u8; 30])?))
}

fn dynamic_codes(bits: &mut Bits) -> Result<(Huffman, Huffman)> {
    let nlen = bits.bits(5)? as usize + 257;
    let ndist = bits.bits(5)? as usize + 1;
    let ncode = bits.bits(4)? as usize + 4;
    if nlen > 286 || ndist > 30 {
        return Err("bad counts in a dynamic block".into());
    }
    let mut clen = [0u8; 19];
    for &i in &CLEN_ORDER[..ncode] {
        clen[i] = bits.bits(3)? as u8;
    }
    let code_lengths = Huffman::new(&clen)?;
    let mut lengths = vec![0u8; nlen + ndist];
    let mut i = 0;
    while i < nlen + ndist {
        let sym = code_lengths.decode(bits)?;
        let (value, repeat) = match sym {
            0..=15 => (sym as u8, 1),
            16 if i == 0 => return Err("repeat with no previous length".into()),
            16 => (lengths[i - 1], 3 + bits.bits(2)? as usize),
            17 => (0, 3 + bits.bits(3)? as usize),
            _ => (0, 11 + bits.bits(7)? as usize),
        };
        if i + repeat > nlen + ndist {
            return Err("too many lengths in a dynamic block".into());
        }
        lengths[i..i + repeat].fill(value);
        i += repeat;
    }
    if lengths[256] == 0 {
        return Err("no end-of-block code in a dynamic block".into());
    }
    Ok((
        Huffman::new(&lengths[..nlen])?,
        Huffman::new(&lengths[nlen..])?,
    ))
}

fn codes(bits: &mut Bits, out: &mut Vec<u8>, lit: &Huffman, dist: &Huffman) -> Result<()> {
    loop {
        let sym = lit.decode(bits)? as usize;
        if sym < 256 {
            out.push(sym as u8);
            continue;
        }
        if sym == 256 {
            return Ok(());
        }
        let sym = sym - 257;
        if sym >= LENGTH_BASE.len() {
            return Err("invalid length code".into());
        }
        let len = LENGTH_BASE[sym] as usize + bits.bits(u32::from(LENGTH_EXTRA[sym]))? as usize;
        let dsym = dist.decode(bits)? as usize;
        if dsym >= DIST_BASE.len() {
            return Err("invalid distance code".into());
        }
        let back = DIST_BASE[dsym] as usize + bits.bits(u32::from(DIST_EXTRA[dsym]))? as usize;
        if back > out.len() {
            return Err("distance reaches before the start of the data".into());
        }
        let from = out.len() - back;
        for k in 0..len {
            out.push(out[from + k]);
        }
    }
}

/// CRC-32 (IEEE 802.3, as gzip).
pub fn crc32(data: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| {
            (0..8).fold(n, |c, _| {
                if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                }
            })
        })
        .collect();
    !data.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}
