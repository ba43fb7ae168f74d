//! A tiny msgpack writer for hand-built event batches (the subset msgspec emits).
#![expect(
    clippy::cast_sign_loss,
    reason = "the encoder range-checks before each cast"
)]

#[derive(Clone, Debug)]
pub enum V {
    Nil,
    Int(i128),
    F(f64),
    S(&'static str),
    B(Vec<u8>),
    A(Vec<V>),
    M(Vec<(&'static str, V)>),
}

pub fn ints(xs: impl IntoIterator<Item = i128>) -> V {
    V::A(xs.into_iter().map(V::Int).collect())
}

pub fn toks(start: u32, n: u32) -> Vec<u32> {
    (start..start + n).collect()
}

pub fn tok_list(t: &[u32]) -> V {
    ints(t.iter().map(|&x| i128::from(x)))
}

pub fn enc(v: &V) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, v);
    out
}

fn len(out: &mut Vec<u8>, n: usize, fix: u8, m16: u8, fix_max: usize) {
    if n <= fix_max {
        out.push(fix | n as u8);
    } else if n <= 0xffff {
        out.push(m16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(m16 + 1);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn put(out: &mut Vec<u8>, v: &V) {
    match v {
        V::Nil => out.push(0xc0),
        V::Int(i) => {
            let i = *i;
            if (0..=0x7f).contains(&i) {
                out.push(i as u8);
            } else if (-32..0).contains(&i) {
                out.push(i as i8 as u8);
            } else if (0..=0xff).contains(&i) {
                out.extend_from_slice(&[0xcc, i as u8]);
            } else if (0..=0xffff).contains(&i) {
                out.push(0xcd);
                out.extend_from_slice(&(i as u16).to_be_bytes());
            } else if (0..=0xffff_ffff).contains(&i) {
                out.push(0xce);
                out.extend_from_slice(&(i as u32).to_be_bytes());
            } else if i > 0 {
                out.push(0xcf);
                out.extend_from_slice(&(i as u64).to_be_bytes());
            } else {
                out.push(0xd3);
                out.extend_from_slice(&(i as i64).to_be_bytes());
            }
        }
        V::F(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        V::S(s) => {
            len(out, s.len(), 0xa0, 0xda, 31);
            out.extend_from_slice(s.as_bytes());
        }
        V::B(b) => {
            out.extend_from_slice(&[0xc4, b.len() as u8]);
            out.extend_from_slice(b);
        }
        V::A(xs) => {
            len(out, xs.len(), 0x90, 0xdc, 15);
            for x in xs {
                put(out, x);
            }
        }
        V::M(kv) => {
            len(out, kv.len(), 0x80, 0xde, 15);
            for (k, x) in kv {
                put(out, &V::S(k));
                put(out, x);
            }
        }
    }
}

/// `[ts, events, dp_rank]`.
pub fn batch(events: Vec<V>, dp: Option<i128>) -> Vec<u8> {
    let mut b = vec![V::F(1.0), V::A(events)];
    if let Some(d) = dp {
        b.push(V::Int(d));
    }
    enc(&V::A(b))
}

/// A map-encoded `BlockStored` (current vLLM).
pub fn stored_map(
    hashes: &[i128],
    parent: Option<i128>,
    tokens: &[u32],
    bs: i128,
    lora: Option<i128>,
) -> V {
    V::M(vec![
        ("type", V::S("BlockStored")),
        ("block_hashes", ints(hashes.iter().copied())),
        ("parent_block_hash", parent.map_or(V::Nil, V::Int)),
        ("token_ids", tok_list(tokens)),
        ("block_size", V::Int(bs)),
        ("lora_id", lora.map_or(V::Nil, V::Int)),
        ("medium", V::S("GPU")),
        ("lora_name", V::Nil),
        ("extra_keys", V::A(hashes.iter().map(|_| V::Nil).collect())),
        ("group_idx", V::Int(0)),
        ("kv_cache_spec_kind", V::S("full_attention")),
    ])
}

/// An array-encoded `BlockStored` (older vLLM), with `medium` and `lora_name`.
pub fn stored_arr(hashes: &[i128], parent: Option<i128>, tokens: &[u32], bs: i128) -> V {
    V::A(vec![
        V::S("BlockStored"),
        ints(hashes.iter().copied()),
        parent.map_or(V::Nil, V::Int),
        tok_list(tokens),
        V::Int(bs),
        V::Nil,
        V::S("GPU"),
        V::Nil,
    ])
}

pub fn removed_map(hashes: &[i128]) -> V {
    V::M(vec![
        ("type", V::S("BlockRemoved")),
        ("block_hashes", ints(hashes.iter().copied())),
        ("medium", V::S("GPU")),
    ])
}
