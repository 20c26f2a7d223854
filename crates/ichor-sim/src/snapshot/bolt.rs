//! A write-only, streaming writer of bbolt database files (the format of `go.etcd.io/bbolt`
//! v1.x, which etcd's backend uses), for databases of top-level buckets holding sorted
//! key/value entries (talos-facts §12.4).
//!
//! The file is laid out in one pass after a planning pass over the entries' sizes, so a large
//! bucket is never held in memory: meta pages 0 and 1, an empty freelist at page 2, every
//! bucket's leaf pages then its branch pages level by level, and last the root bucket's pages
//! (the meta pages, written first, name them). Small buckets are inlined in their parent as
//! bbolt inlines them. Not here: reading, updating, nested buckets below the top level.

use std::io::{self, Write};

/// The page size written (the common OS page size, which etcd's files use).
pub(crate) const PAGE: usize = 4096;

pub(super) const PAGE_HEADER: usize = 16;
pub(super) const ELEMENT: usize = 16;
pub(super) const BUCKET_HEADER: usize = 16;
const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
pub(super) const FLAG_BRANCH: u16 = 0x01;
pub(super) const FLAG_LEAF: u16 = 0x02;
pub(super) const FLAG_META: u16 = 0x04;
pub(super) const FLAG_FREELIST: u16 = 0x10;
pub(super) const LEAF_BUCKET: u32 = 0x01;
/// The first page after the two meta pages and the freelist.
const FIRST_DATA_PAGE: u64 = 3;

/// What receives entries with their values, one at a time.
pub(crate) type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> io::Result<()> + 'a;

/// One bucket's entries in strictly ascending key order, visited twice with the same result:
/// once for the sizes (planning), once for the bytes (writing).
pub(crate) trait Entries {
    /// Calls `visit(key, value length)` for each entry, in order.
    fn sizes(&self, visit: &mut dyn FnMut(&[u8], usize));
    /// Calls `visit(key, value)` for each entry, in order; stops at the first error.
    fn write(&self, visit: &mut Visit<'_>) -> io::Result<()>;
}

/// Entries held in memory (small buckets), sorted on construction.
#[derive(Debug, Clone, Default)]
pub(crate) struct Small(Vec<(Vec<u8>, Vec<u8>)>);

impl Small {
    /// The entries, sorted by key (a later duplicate key replaces an earlier one).
    pub(crate) fn new(mut entries: Vec<(Vec<u8>, Vec<u8>)>) -> Self {
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        Self(entries)
    }
}

impl Entries for Small {
    fn sizes(&self, visit: &mut dyn FnMut(&[u8], usize)) {
        for (k, v) in &self.0 {
            visit(k, v.len());
        }
    }

    fn write(&self, visit: &mut Visit<'_>) -> io::Result<()> {
        self.0.iter().try_for_each(|(k, v)| visit(k, v))
    }
}

/// A leaf page of the plan: how many entries, from which key, on how many pages.
#[derive(Debug, Clone)]
struct Leaf {
    id: u64,
    count: usize,
    first_key: Vec<u8>,
    pages: u64,
}

/// A branch page: its children's first keys and page ids.
#[derive(Debug, Clone)]
struct Branch {
    id: u64,
    children: Vec<(Vec<u8>, u64)>,
}

/// Where a bucket's pages are.
#[derive(Debug, Clone)]
struct Tree {
    leaves: Vec<Leaf>,
    /// Branch levels, bottom up; the last level's single page is the root.
    branches: Vec<Vec<Branch>>,
    root: u64,
}

/// How a bucket is stored.
#[derive(Debug, Clone)]
enum Layout {
    /// In its parent's leaf, after the bucket header (root 0).
    Inline(Vec<u8>),
    /// In pages of its own.
    Pages(Tree),
}

/// Splits entries into leaf pages as their sizes arrive, filling each page (a single entry
/// larger than a page gets a page of its own with overflow), numbering pages from `next`.
#[derive(Debug)]
struct LeafPlanner {
    next: u64,
    leaves: Vec<Leaf>,
    /// The open page: first key, entries, bytes.
    current: Option<(Vec<u8>, usize, usize)>,
    /// The size of all entries as one inline page.
    inline_size: usize,
    /// Whether to keep the leaves (a [`PageCount`] only counts them).
    keep: bool,
}

/// Counts the leaf pages entries take, laid out as the writer lays them out.
#[derive(Debug)]
pub(crate) struct PageCount(LeafPlanner);

impl Default for PageCount {
    fn default() -> Self {
        Self(LeafPlanner {
            keep: false,
            ..LeafPlanner::new(0)
        })
    }
}

impl PageCount {
    /// Adds an entry.
    pub(crate) fn push(&mut self, key: &[u8], len: usize) {
        self.0.push(key, len);
    }

    /// The pages taken so far, the open one included.
    pub(crate) fn pages(&self) -> u64 {
        self.0.next + u64::from(self.0.current.is_some())
    }
}

impl LeafPlanner {
    fn new(next: u64) -> Self {
        Self {
            next,
            leaves: Vec::new(),
            current: None,
            inline_size: PAGE_HEADER,
            keep: true,
        }
    }

    fn push(&mut self, key: &[u8], len: usize) {
        let size = ELEMENT + key.len() + len;
        self.inline_size = self.inline_size.saturating_add(size);
        if self
            .current
            .as_ref()
            .is_some_and(|(_, _, bytes)| bytes + size > PAGE)
        {
            self.close();
        }
        let keep = self.keep;
        let entry = self
            .current
            .get_or_insert_with(|| (if keep { key.to_vec() } else { Vec::new() }, 0, PAGE_HEADER));
        entry.1 += 1;
        entry.2 += size;
        if entry.2 > PAGE || entry.1 == usize::from(u16::MAX) {
            self.close();
        }
    }

    fn close(&mut self) {
        if let Some((first_key, count, bytes)) = self.current.take() {
            let pages = bytes.div_ceil(PAGE) as u64;
            if self.keep {
                self.leaves.push(Leaf {
                    id: self.next,
                    count,
                    first_key,
                    pages,
                });
            }
            self.next += pages;
        }
    }

    /// The tree over the planned leaves (an empty one gets one empty leaf: the root bucket of
    /// an empty database), and the next free page.
    fn finish(mut self) -> (Tree, u64) {
        self.close();
        let mut next = self.next;
        let mut leaves = self.leaves;
        if leaves.is_empty() {
            leaves.push(Leaf {
                id: next,
                count: 0,
                first_key: Vec::new(),
                pages: 1,
            });
            next += 1;
        }
        let children = leaves.iter().map(|l| (l.first_key.clone(), l.id)).collect();
        let (branches, root) = plan_branches(children, &mut next);
        (
            Tree {
                leaves,
                branches,
                root,
            },
            next,
        )
    }
}

/// Builds branch levels over `children` (first key, page id) until one page is the root.
fn plan_branches(mut children: Vec<(Vec<u8>, u64)>, next: &mut u64) -> (Vec<Vec<Branch>>, u64) {
    let mut levels = Vec::new();
    while children.len() > 1 {
        let mut level: Vec<Branch> = Vec::new();
        let mut bytes = PAGE_HEADER;
        for (key, id) in children {
            let size = ELEMENT + key.len();
            match level.last_mut() {
                Some(page)
                    if bytes + size <= PAGE && page.children.len() < usize::from(u16::MAX) =>
                {
                    page.children.push((key, id));
                    bytes += size;
                }
                _ => {
                    level.push(Branch {
                        id: *next,
                        children: vec![(key, id)],
                    });
                    *next += 1;
                    bytes = PAGE_HEADER + size;
                }
            }
        }
        children = level
            .iter()
            .map(|b| (b.children[0].0.clone(), b.id))
            .collect();
        levels.push(level);
    }
    let root = children.first().map_or(0, |c| c.1);
    (levels, root)
}

/// The bytes of a leaf page (or an inline bucket's page) holding `entries`, padded to `len`.
fn leaf_bytes(id: u64, entries: &[(&[u8], &[u8])], flags: u32, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let pages = len.div_ceil(PAGE).max(1);
    header(&mut out, id, FLAG_LEAF, entries.len(), pages - 1);
    let mut data = PAGE_HEADER + ELEMENT * entries.len();
    for (i, (k, v)) in entries.iter().enumerate() {
        let at = PAGE_HEADER + ELEMENT * i;
        put_u32(&mut out, flags);
        put_u32(&mut out, u32_of(data - at));
        put_u32(&mut out, u32_of(k.len()));
        put_u32(&mut out, u32_of(v.len()));
        data += k.len() + v.len();
    }
    for (k, v) in entries {
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    out.resize(len.max(out.len()), 0);
    out
}

fn header(out: &mut Vec<u8>, id: u64, flags: u16, count: usize, overflow: usize) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&u16::try_from(count).unwrap_or(u16::MAX).to_le_bytes());
    put_u32(out, u32_of(overflow));
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Offsets and sizes inside one page (or one large entry) always fit.
fn u32_of(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A bucket's value in its parent: the bucket header, then the inline page if inline.
fn bucket_value(layout: &Layout) -> Vec<u8> {
    let mut out = Vec::new();
    match layout {
        Layout::Inline(page) => {
            out.extend_from_slice(&0u64.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
            out.extend_from_slice(page);
        }
        Layout::Pages(tree) => {
            out.extend_from_slice(&tree.root.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
        }
    }
    debug_assert!(out.len() >= BUCKET_HEADER);
    out
}

/// FNV-1a, 64 bits: bbolt's meta checksum.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A meta page: `id` 0 or 1, `txid` the transaction it records.
fn meta_page(id: u64, root: u64, hwm: u64, txid: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(PAGE);
    header(&mut out, id, FLAG_META, 0, 0);
    let start = out.len();
    put_u32(&mut out, MAGIC);
    put_u32(&mut out, VERSION);
    put_u32(&mut out, u32_of(PAGE));
    put_u32(&mut out, 0);
    out.extend_from_slice(&root.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // root sequence
    out.extend_from_slice(&2u64.to_le_bytes()); // freelist page
    out.extend_from_slice(&hwm.to_le_bytes());
    out.extend_from_slice(&txid.to_le_bytes());
    let checksum = fnv1a(&out[start..]);
    out.extend_from_slice(&checksum.to_le_bytes());
    out.resize(PAGE, 0);
    out
}

/// A planned database: what every page holds, before any is written.
pub(crate) struct Plan<'a> {
    buckets: Vec<(Vec<u8>, &'a dyn Entries, Layout)>,
    root: Tree,
    root_entries: Vec<(Vec<u8>, Vec<u8>)>,
    hwm: u64,
    txid: u64,
}

impl std::fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("pages", &self.hwm)
            .finish_non_exhaustive()
    }
}

impl<'a> Plan<'a> {
    /// Plans a database of the given top-level buckets (any order; names must differ),
    /// recording transaction `txid` (at least 1).
    pub(crate) fn new(buckets: Vec<(&[u8], &'a dyn Entries)>, txid: u64) -> Self {
        let mut next = FIRST_DATA_PAGE;
        let mut sorted = buckets;
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut planned = Vec::new();
        for (name, entries) in sorted {
            let mut planner = LeafPlanner::new(next);
            entries.sizes(&mut |k, len| planner.push(k, len));
            let layout = if planner.inline_size <= PAGE / 4 {
                let mut held: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                // In memory by definition: a quarter page at most.
                let _ = entries.write(&mut |k, v| {
                    held.push((k.to_vec(), v.to_vec()));
                    Ok(())
                });
                let refs: Vec<(&[u8], &[u8])> = held
                    .iter()
                    .map(|(k, v)| (k.as_slice(), v.as_slice()))
                    .collect();
                Layout::Inline(leaf_bytes(0, &refs, 0, 0))
            } else {
                let (tree, after) = planner.finish();
                next = after;
                Layout::Pages(tree)
            };
            planned.push((name.to_vec(), entries, layout));
        }
        let root_entries: Vec<(Vec<u8>, Vec<u8>)> = planned
            .iter()
            .map(|(name, _, layout)| (name.clone(), bucket_value(layout)))
            .collect();
        let mut planner = LeafPlanner::new(next);
        for (k, v) in &root_entries {
            planner.push(k, v.len());
        }
        let (root, hwm) = planner.finish();
        Self {
            buckets: planned,
            root,
            root_entries,
            hwm,
            txid: txid.max(1),
        }
    }

    /// The size of the database file in bytes (every page up to the high-water mark).
    pub(crate) fn size(&self) -> u64 {
        self.hwm * PAGE as u64
    }

    /// Writes the database to `out`, streaming each bucket's entries once more.
    pub(crate) fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(&meta_page(0, self.root.root, self.hwm, self.txid))?;
        out.write_all(&meta_page(1, self.root.root, self.hwm, self.txid - 1))?;
        let mut freelist = Vec::with_capacity(PAGE);
        header(&mut freelist, 2, FLAG_FREELIST, 0, 0);
        freelist.resize(PAGE, 0);
        out.write_all(&freelist)?;
        for (_, entries, layout) in &self.buckets {
            if let Layout::Pages(tree) = layout {
                write_leaves(tree, &mut |visit| entries.write(visit), 0, out)?;
                write_branches(tree, out)?;
            }
        }
        let root_entries = &self.root_entries;
        write_leaves(
            &self.root,
            &mut |visit| root_entries.iter().try_for_each(|(k, v)| visit(k, v)),
            LEAF_BUCKET,
            out,
        )?;
        write_branches(&self.root, out)
    }
}

type Source<'s> = dyn FnMut(&mut Visit<'_>) -> io::Result<()> + 's;

/// Writes a tree's leaf pages from its entries, one page buffer at a time.
fn write_leaves(
    tree: &Tree,
    source: &mut Source<'_>,
    flags: u32,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut leaves = tree.leaves.iter();
    let mut current = leaves.next();
    let mut held: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut flush = |held: &mut Vec<(Vec<u8>, Vec<u8>)>, leaf: &Leaf| -> io::Result<()> {
        let refs: Vec<(&[u8], &[u8])> = held
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        let pages = usize::try_from(leaf.pages).unwrap_or(usize::MAX);
        out.write_all(&leaf_bytes(leaf.id, &refs, flags, pages * PAGE))?;
        held.clear();
        Ok(())
    };
    source(&mut |k, v| {
        let Some(leaf) = current else {
            return Err(io::Error::other("more entries than planned"));
        };
        held.push((k.to_vec(), v.to_vec()));
        if held.len() == leaf.count {
            flush(&mut held, leaf)?;
            current = leaves.next();
        }
        Ok(())
    })?;
    match current {
        // An empty root leaf is written as planned; anything else missing is a bug.
        Some(leaf) if leaf.count == 0 && held.is_empty() => flush(&mut held, leaf),
        Some(_) => Err(io::Error::other("fewer entries than planned")),
        None => Ok(()),
    }
}

fn write_branches(tree: &Tree, out: &mut dyn Write) -> io::Result<()> {
    for level in &tree.branches {
        for page in level {
            let mut buf = Vec::with_capacity(PAGE);
            header(&mut buf, page.id, FLAG_BRANCH, page.children.len(), 0);
            let mut data = PAGE_HEADER + ELEMENT * page.children.len();
            for (i, (key, id)) in page.children.iter().enumerate() {
                let at = PAGE_HEADER + ELEMENT * i;
                put_u32(&mut buf, u32_of(data - at));
                put_u32(&mut buf, u32_of(key.len()));
                buf.extend_from_slice(&id.to_le_bytes());
                data += key.len();
            }
            for (key, _) in &page.children {
                buf.extend_from_slice(key);
            }
            buf.resize(PAGE, 0);
            out.write_all(&buf)?;
        }
    }
    Ok(())
}

/// What a bbolt file's first meta page says, as bbolt checks it on open (magic, version,
/// checksum); enough to tell a bbolt file from anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The page size.
    pub(crate) page_size: u32,
    /// The high-water mark: pages in use.
    pub(crate) pages: u64,
    /// The transaction id.
    pub(crate) txid: u64,
    /// The root bucket's root page.
    pub(crate) root: u64,
    /// The freelist's page (`u64::MAX`: none).
    pub(crate) freelist: u64,
}

/// Reads and validates the meta pages of a bbolt file as bbolt does on open: the first page,
/// else the second one found by trying page sizes from 1 KiB up; the newer valid one wins,
/// and the file must hold every page up to the high-water mark.
pub(crate) fn read_meta(file: &[u8]) -> Result<Meta, String> {
    let parse = |at: usize| -> Result<Meta, String> {
        let meta = file
            .get(at + PAGE_HEADER..at + PAGE_HEADER + 64)
            .ok_or("the file is too small for a bbolt meta page")?;
        let word = |i: usize| u32::from_le_bytes([meta[i], meta[i + 1], meta[i + 2], meta[i + 3]]);
        let long = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&meta[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if word(0) != MAGIC {
            return Err("invalid database".into());
        }
        if word(4) != VERSION {
            return Err("version mismatch".into());
        }
        if fnv1a(&meta[..56]) != long(56) {
            return Err("checksum error".into());
        }
        Ok(Meta {
            page_size: word(8),
            pages: long(40),
            txid: long(48),
            root: long(16),
            freelist: long(32),
        })
    };
    let first = parse(0);
    let page = first
        .as_ref()
        .ok()
        .map(|m| usize::try_from(m.page_size).unwrap_or(PAGE));
    let second = match page {
        Some(page) => parse(page),
        None => (0..=14)
            .map(|i| 1024usize << i)
            .take_while(|&at| at + 1024 < file.len())
            .map(parse)
            .find(Result::is_ok)
            .unwrap_or_else(|| Err("invalid database".into())),
    };
    let meta = match (first, second) {
        (Ok(a), Ok(b)) => {
            if b.txid > a.txid {
                b
            } else {
                a
            }
        }
        (Ok(m), Err(_)) | (Err(_), Ok(m)) => m,
        (Err(e), Err(_)) => return Err(e),
    };
    let needed = meta.pages.saturating_mul(u64::from(meta.page_size));
    if (file.len() as u64) < needed {
        return Err(format!(
            "the file holds {} bytes, its meta page names {} pages of {} bytes",
            file.len(),
            meta.pages,
            meta.page_size
        ));
    }
    Ok(meta)
}
