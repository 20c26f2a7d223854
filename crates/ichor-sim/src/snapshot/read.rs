//! Reading bbolt files: an uploaded snapshot as etcd's restore reads it (go.etcd.io/bbolt
//! v1.5.0, which Talos v1.14.0-rc.1 links through etcdutl v3.7.1): the meta page bbolt opens
//! with, the trees of the root bucket and of each top-level bucket, and bbolt's own
//! consistency check (`tx_check.go` `Tx.Check`) for what this reader can see of it.
//!
//! Everything is read from the bytes in place. A page or element that points outside the file
//! is an error here; bbolt reads its memory map without such checks, and what a process does
//! then is not modelled.

use std::collections::{BTreeMap, BTreeSet};

use super::bolt::{
    self, BUCKET_HEADER, ELEMENT, FLAG_BRANCH, FLAG_FREELIST, FLAG_LEAF, FLAG_META, LEAF_BUCKET,
    PAGE_HEADER,
};

/// A bbolt file opened for reading.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Db<'a> {
    file: &'a [u8],
    page_size: usize,
    meta: bolt::Meta,
}

/// One page as its header describes it, with the bytes it spans (overflow included, cut at
/// the end of the file).
#[derive(Debug, Clone, Copy)]
struct Page<'a> {
    /// The id its header names.
    id: u64,
    flags: u16,
    count: usize,
    overflow: u64,
    bytes: &'a [u8],
}

impl Page<'_> {
    /// bbolt's name for the page's type (`common.Page.Typ`).
    fn typ(&self) -> String {
        match self.flags {
            FLAG_BRANCH => "branch".into(),
            FLAG_LEAF => "leaf".into(),
            FLAG_META => "meta".into(),
            FLAG_FREELIST => "freelist".into(),
            other => format!("unknown<{other:02x}>"),
        }
    }
}

/// One top-level bucket: inline in its parent's leaf, or in pages from a root.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bucket<'a> {
    /// The inline page (page header and elements) after the bucket header.
    Inline(&'a [u8]),
    /// The root page of its tree.
    Pages(u64),
}

/// One entry of a leaf: its flags (`LEAF_BUCKET` for a nested bucket), key and value.
pub(crate) type Entry<'a> = (u32, &'a [u8], &'a [u8]);

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<usize> {
    let v = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
    usize::try_from(v).ok()
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A page stack as Go's `%v` prints a `[]Pgid`.
fn stack_string(stack: &[u64]) -> String {
    let ids: Vec<String> = stack.iter().map(u64::to_string).collect();
    format!("[{}]", ids.join(" "))
}

/// The entries of a leaf page (or an inline bucket's page) held in `page`.
fn leaf_entries<'a>(page: &'a [u8], count: usize) -> Result<Vec<Entry<'a>>, String> {
    (0..count)
        .map(|i| {
            let e = PAGE_HEADER + ELEMENT * i;
            let bad = || format!("leaf element {i} lies outside its page");
            let flags = u32::try_from(u32_at(page, e).ok_or_else(bad)?).unwrap_or(0);
            let pos = e + u32_at(page, e + 4).ok_or_else(bad)?;
            let ksize = u32_at(page, e + 8).ok_or_else(bad)?;
            let vsize = u32_at(page, e + 12).ok_or_else(bad)?;
            let key = page.get(pos..pos + ksize).ok_or_else(bad)?;
            let value = page.get(pos + ksize..pos + ksize + vsize).ok_or_else(bad)?;
            Ok((flags, key, value))
        })
        .collect()
}

/// The elements of a branch page: each child's first key and page id.
fn branch_entries(page: &[u8], count: usize) -> Result<Vec<(&[u8], u64)>, String> {
    (0..count)
        .map(|i| {
            let e = PAGE_HEADER + ELEMENT * i;
            let bad = || format!("branch element {i} lies outside its page");
            let pos = e + u32_at(page, e).ok_or_else(bad)?;
            let ksize = u32_at(page, e + 4).ok_or_else(bad)?;
            let child = u64_at(page, e + 8).ok_or_else(bad)?;
            Ok((page.get(pos..pos + ksize).ok_or_else(bad)?, child))
        })
        .collect()
}

impl<'a> Db<'a> {
    /// Opens a bbolt file as bbolt does ([`bolt::read_meta`]: the newer valid meta page, and
    /// every page up to its high-water mark present).
    pub(crate) fn open(file: &'a [u8]) -> Result<Self, String> {
        let meta = bolt::read_meta(file)?;
        let page_size = usize::try_from(meta.page_size).unwrap_or(bolt::PAGE);
        if page_size < PAGE_HEADER + 64 {
            return Err("invalid database".into());
        }
        Ok(Self {
            file,
            page_size,
            meta,
        })
    }

    fn page(&self, id: u64) -> Result<Page<'a>, String> {
        let at = usize::try_from(id)
            .ok()
            .and_then(|id| id.checked_mul(self.page_size))
            .filter(|at| at + PAGE_HEADER <= self.file.len())
            .ok_or_else(|| format!("page {id} lies beyond the end of the file"))?;
        let header = &self.file[at..at + PAGE_HEADER];
        let overflow = u64::try_from(u32_at(header, 12).unwrap_or(0)).unwrap_or(0);
        let span = usize::try_from(overflow + 1)
            .ok()
            .and_then(|n| n.checked_mul(self.page_size))
            .unwrap_or(usize::MAX);
        let end = at.saturating_add(span).min(self.file.len());
        Ok(Page {
            id: u64_at(header, 0).unwrap_or(0),
            flags: u16_at(header, 8).unwrap_or(0),
            count: usize::from(u16_at(header, 10).unwrap_or(0)),
            overflow,
            bytes: &self.file[at..end],
        })
    }

    /// Visits every entry of the tree rooted at page `root`, in the order of its pages.
    pub(crate) fn walk(
        &self,
        root: u64,
        visit: &mut dyn FnMut(Entry<'a>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.walk_depth(root, visit, 0)
    }

    fn walk_depth(
        &self,
        id: u64,
        visit: &mut dyn FnMut(Entry<'a>) -> Result<(), String>,
        depth: usize,
    ) -> Result<(), String> {
        // bbolt trees are shallow; a deeper one loops.
        if depth > 64 {
            return Err(format!("page {id}: the tree below it does not end"));
        }
        let page = self.page(id)?;
        match page.flags {
            FLAG_BRANCH => {
                for (_, child) in branch_entries(page.bytes, page.count)? {
                    self.walk_depth(child, visit, depth + 1)?;
                }
                Ok(())
            }
            FLAG_LEAF => leaf_entries(page.bytes, page.count)?
                .into_iter()
                .try_for_each(visit),
            other => Err(format!(
                "unexpected page type (flags: {other:x}) for pgId:{id}"
            )),
        }
    }

    /// The root bucket's entries: the top-level buckets (and anything else stored there).
    pub(crate) fn top(&self) -> Result<Vec<Entry<'a>>, String> {
        let mut out = Vec::new();
        self.walk(self.meta.root, &mut |e| {
            out.push(e);
            Ok(())
        })?;
        Ok(out)
    }

    /// The top-level bucket named `name`, if there is one.
    pub(crate) fn bucket(&self, name: &[u8]) -> Result<Option<Bucket<'a>>, String> {
        Ok(self
            .top()?
            .into_iter()
            .find(|(flags, key, _)| flags & LEAF_BUCKET != 0 && *key == name)
            .and_then(|(_, _, value)| Self::bucket_of(value)))
    }

    /// A bucket from its value in the parent's leaf (`None`: too short for a bucket header).
    pub(crate) fn bucket_of(value: &'a [u8]) -> Option<Bucket<'a>> {
        let root = u64_at(value, 0)?;
        if root == 0 {
            value.get(BUCKET_HEADER..).map(Bucket::Inline)
        } else {
            Some(Bucket::Pages(root))
        }
    }

    /// Visits every entry of a bucket in order.
    pub(crate) fn entries(
        &self,
        bucket: Bucket<'a>,
        visit: &mut dyn FnMut(Entry<'a>) -> Result<(), String>,
    ) -> Result<(), String> {
        match bucket {
            Bucket::Inline(page) => {
                let count = usize::from(
                    u16_at(page, 10).ok_or("an inline bucket too short for its page header")?,
                );
                leaf_entries(page, count)?.into_iter().try_for_each(visit)
            }
            Bucket::Pages(root) => self.walk(root, visit),
        }
    }

    /// bbolt's consistency check (`Tx.Check` with the default options, v1.5.0 `tx_check.go`):
    /// the freelist, every page of every bucket tree (in bounds, referenced once, not freed, a
    /// branch or a leaf), the order of the keys, and every page up to the high-water mark
    /// either reachable or free. The errors in bbolt's words, in its order.
    pub(crate) fn check(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut reachable = BTreeSet::from([0u64, 1]);
        let mut freed = BTreeSet::new();
        if self.meta.freelist != u64::MAX {
            match self.freelist() {
                Ok((ids, overflow)) => {
                    for id in ids {
                        if !freed.insert(id) {
                            errors.push(format!("page {id}: already freed"));
                        }
                    }
                    for i in 0..=overflow {
                        reachable.insert(self.meta.freelist + i);
                    }
                }
                // bbolt panics loading it, which ends the check.
                Err(e) => return vec![format!("panic: {e}")],
            }
        }
        let mut checker = Checker {
            db: self,
            reachable,
            freed,
            errors,
        };
        checker.bucket(self.meta.root);
        let Checker {
            reachable,
            freed,
            mut errors,
            ..
        } = checker;
        for id in 0..self.meta.pages {
            if !reachable.contains(&id) && !freed.contains(&id) {
                errors.push(format!("page {id}: unreachable unfreed"));
            }
        }
        errors
    }

    /// The free page ids the freelist page lists, and its overflow.
    fn freelist(&self) -> Result<(Vec<u64>, u64), String> {
        let page = self.page(self.meta.freelist)?;
        if page.flags != FLAG_FREELIST {
            return Err(format!(
                "invalid freelist page: {}, page type is {}",
                page.id,
                page.typ()
            ));
        }
        let (count, first) = if page.count == 0xFFFF {
            let count = u64_at(page.bytes, PAGE_HEADER).ok_or("freelist count beyond its page")?;
            (usize::try_from(count).unwrap_or(usize::MAX), 1usize)
        } else {
            (page.count, 0)
        };
        let ids = (first..first.saturating_add(count))
            .map(|i| {
                u64_at(page.bytes, PAGE_HEADER + 8 * i).ok_or("freelist id beyond its page".into())
            })
            .collect::<Result<Vec<u64>, String>>()?;
        Ok((ids, page.overflow))
    }
}

/// The state of one consistency check.
struct Checker<'d, 'a> {
    db: &'d Db<'a>,
    reachable: BTreeSet<u64>,
    freed: BTreeSet<u64>,
    errors: Vec<String>,
}

impl Checker<'_, '_> {
    /// `recursivelyCheckBucket`: the bucket's pages, then each nested bucket's (inline buckets
    /// have no pages of their own and are not looked into).
    fn bucket(&mut self, root: u64) {
        if root == 0 {
            return;
        }
        self.pages(root, &mut vec![root]);
        let mut order = KeyOrder::default();
        self.key_order(root, None, None, &mut Vec::new(), &mut order);
        let mut nested = Vec::new();
        let _ = self.db.walk(root, &mut |(flags, _, value)| {
            if flags & LEAF_BUCKET != 0
                && let Some(Bucket::Pages(child)) = Db::bucket_of(value)
            {
                nested.push(child);
            }
            Ok(())
        });
        for child in nested {
            self.bucket(child);
        }
    }

    /// `forEachPage` with `verifyPageReachable`.
    fn pages(&mut self, id: u64, stack: &mut Vec<u64>) {
        if stack.len() > 64 {
            return;
        }
        let page = match self.db.page(id) {
            Ok(page) => page,
            Err(e) => {
                self.errors.push(format!("panic: {e}"));
                return;
            }
        };
        let hwm = self.db.meta.pages;
        let trail = stack_string(stack);
        if page.id > hwm {
            self.errors.push(format!(
                "page {}: out of bounds: {hwm} (stack: {trail})",
                page.id
            ));
        }
        for i in 0..=page.overflow {
            let at = page.id + i;
            if !self.reachable.insert(at) {
                self.errors
                    .push(format!("page {at}: multiple references (stack: {trail})"));
            }
        }
        if self.freed.contains(&page.id) {
            self.errors
                .push(format!("page {}: reachable freed", page.id));
        } else if page.flags != FLAG_BRANCH && page.flags != FLAG_LEAF {
            self.errors.push(format!(
                "page {}: invalid type: {} (stack: {trail})",
                page.id,
                page.typ()
            ));
        }
        if page.flags == FLAG_BRANCH {
            match branch_entries(page.bytes, page.count) {
                Ok(children) => {
                    for (_, child) in children {
                        stack.push(child);
                        self.pages(child, stack);
                        stack.pop();
                    }
                }
                Err(e) => self.errors.push(format!("panic: {e}")),
            }
        }
    }

    /// `recursivelyCheckPageKeyOrderInternal`: keys ascend within each page, stay at or above
    /// the key their parent names and below the next one. Returns the largest key below.
    fn key_order(
        &mut self,
        id: u64,
        min_closed: Option<Vec<u8>>,
        max_open: Option<Vec<u8>>,
        stack: &mut Vec<u64>,
        order: &mut KeyOrder,
    ) -> Option<Vec<u8>> {
        if stack.len() > 64 || !order.seen.insert(id) {
            return None;
        }
        let page = match self.db.page(id) {
            Ok(page) => page,
            Err(e) => {
                self.errors.push(format!("panic: {e}"));
                return None;
            }
        };
        stack.push(id);
        let mut max_in_subtree = None;
        match page.flags {
            FLAG_BRANCH => match branch_entries(page.bytes, page.count) {
                Ok(children) => {
                    let mut running_min = min_closed;
                    for (i, (key, child)) in children.iter().enumerate() {
                        self.verify(
                            *child,
                            "branch",
                            i,
                            key,
                            running_min.as_deref(),
                            max_open.as_deref(),
                            stack,
                        );
                        let max_key = children
                            .get(i + 1)
                            .map(|(k, _)| k.to_vec())
                            .or_else(|| max_open.clone());
                        max_in_subtree =
                            self.key_order(*child, Some(key.to_vec()), max_key, stack, order);
                        running_min.clone_from(&max_in_subtree);
                    }
                }
                Err(e) => self.errors.push(format!("panic: {e}")),
            },
            FLAG_LEAF => match leaf_entries(page.bytes, page.count) {
                Ok(entries) => {
                    let mut running_min = min_closed;
                    for (i, (_, key, _)) in entries.iter().enumerate() {
                        self.verify(
                            id,
                            "leaf",
                            i,
                            key,
                            running_min.as_deref(),
                            max_open.as_deref(),
                            stack,
                        );
                        running_min = Some(key.to_vec());
                    }
                    max_in_subtree = entries.last().map(|(_, k, _)| k.to_vec());
                }
                Err(e) => self.errors.push(format!("panic: {e}")),
            },
            other => self.errors.push(format!(
                "unexpected page type (flags: {other:x}) for pgId:{id}"
            )),
        }
        stack.pop();
        max_in_subtree
    }

    /// `verifyKeyOrder`, with its messages.
    #[allow(clippy::too_many_arguments)]
    fn verify(
        &mut self,
        id: u64,
        kind: &str,
        index: usize,
        key: &[u8],
        previous: Option<&[u8]>,
        max_open: Option<&[u8]>,
        stack: &[u64],
    ) {
        let trail = stack_string(stack);
        let (k, p) = (hex(key), previous.map(hex).unwrap_or_default());
        if index == 0
            && let Some(previous) = previous
            && previous > key
        {
            self.errors.push(format!(
                "the first key[{index}]=(hex){k} on {kind} page({id}) needs to be >= the key in the ancestor ({p}). Stack: {trail}"
            ));
        }
        if index > 0 {
            let previous = previous.unwrap_or_default();
            if previous > key {
                self.errors.push(format!(
                    "key[{index}]=(hex){k} on {kind} page({id}) needs to be > (found <) than previous element (hex){p}. Stack: {trail}"
                ));
            }
            if previous == key {
                self.errors.push(format!(
                    "key[{index}]=(hex){k} on {kind} page({id}) needs to be > (found =) than previous element (hex){p}. Stack: {trail}"
                ));
            }
        }
        if let Some(max) = max_open
            && key >= max
        {
            self.errors.push(format!(
                "key[{index}]=(hex){k} on {kind} page({id}) needs to be < than key of the next element in ancestor (hex){p}. Pages stack: {trail}"
            ));
        }
    }
}

/// Pages whose key order was checked in this pass (a page reached twice is reported by the
/// reachability check; looking again would loop on a cycle).
#[derive(Default)]
struct KeyOrder {
    seen: BTreeSet<u64>,
}

/// Every entry of the named top-level buckets, copied out (small buckets: `meta`, `lease`).
pub(crate) fn small_bucket(db: &Db<'_>, name: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    if let Some(bucket) = db.bucket(name)? {
        db.entries(bucket, &mut |(_, k, v)| {
            out.insert(k.to_vec(), v.to_vec());
            Ok(())
        })?;
    }
    Ok(out)
}
