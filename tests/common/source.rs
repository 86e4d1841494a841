//! The crate's sources as the house's tests read them: every file under `src/`, parsed
//! with syn, its tests (every item under `#[cfg(test)]`, wherever it stands in the
//! file) told apart from its production code, and its production functions with
//! their lengths.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// One file under `src/`.
pub struct Source {
    /// Its path relative to `src/`, such as `fs/ops/mod.rs`.
    pub rel: String,
    pub text: String,
    /// The lines (from 1) that belong to tests: items under `#[cfg(test)]`, their
    /// attributes and doc comments with them.
    pub test_lines: BTreeSet<usize>,
    /// Its production functions: free functions, methods and trait methods with a
    /// body, outside tests.
    pub functions: Vec<Function>,
    /// The modules it declares under `#[cfg(test)]` whose code is a file of its own.
    pub test_modules: Vec<String>,
}

pub struct Function {
    /// `name`, or `Type::name` for a method.
    pub name: String,
    /// The line of its `fn`.
    pub line: usize,
    /// From its `fn` to its closing brace.
    pub lines: usize,
}

impl Source {
    /// The production code: every line outside tests, comment lines left out.
    pub fn production(&self) -> String {
        self.text
            .lines()
            .enumerate()
            .filter(|(i, l)| {
                !self.test_lines.contains(&(i + 1)) && !l.trim_start().starts_with("//")
            })
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// How many lines of the file are production code (comments and blank lines
    /// counted, as a reader scrolls them).
    pub fn production_lines(&self) -> usize {
        self.text.lines().count() - self.test_lines.len()
    }
}

pub fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `.rs` file under `src/`, sorted by path.
pub fn all() -> Vec<Source> {
    let mut paths = Vec::new();
    walk(&src(), &mut paths);
    paths.sort();
    let mut sources: Vec<Source> = paths.iter().map(|p| read(p)).collect();
    // A file a `#[cfg(test)] mod x;` declares is all test.
    let tests: BTreeSet<String> = sources
        .iter()
        .flat_map(|s| s.test_modules.iter().map(move |m| child(&s.rel, m)))
        .flatten()
        .collect();
    for s in &mut sources {
        if tests.contains(&s.rel) {
            s.test_lines = (1..=s.text.lines().count()).collect();
            s.functions.clear();
        }
    }
    sources
}

/// The files `mod name;` in the file `rel` can be: `name.rs` or `name/mod.rs` beside a
/// `mod.rs`, `lib.rs` or `main.rs`, in a folder of the file's own name otherwise.
fn child(rel: &str, name: &str) -> [String; 2] {
    let (dir, file) = rel.rsplit_once('/').map_or(("", rel), |(d, f)| (d, f));
    let base = if matches!(file, "mod.rs" | "lib.rs" | "main.rs") {
        dir.to_string()
    } else {
        let stem = file.trim_end_matches(".rs");
        if dir.is_empty() {
            stem.to_string()
        } else {
            format!("{dir}/{stem}")
        }
    };
    let at = |f: String| {
        if base.is_empty() {
            f
        } else {
            format!("{base}/{f}")
        }
    };
    [at(format!("{name}.rs")), at(format!("{name}/mod.rs"))]
}

pub fn read(path: &Path) -> Source {
    let text = fs::read_to_string(path).unwrap();
    let rel = path.strip_prefix(src()).unwrap().display().to_string();
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut reader = Reader {
        test_lines: BTreeSet::new(),
        functions: Vec::new(),
        owner: Vec::new(),
        test_modules: Vec::new(),
    };
    reader.visit_file(&file);
    Source {
        rel,
        text,
        test_lines: reader.test_lines,
        functions: reader.functions,
        test_modules: reader.test_modules,
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

struct Reader {
    test_lines: BTreeSet<usize>,
    functions: Vec<Function>,
    /// The types whose impl or trait blocks the visit is in.
    owner: Vec<String>,
    test_modules: Vec<String>,
}

impl Reader {
    /// Marks a test item's lines, from its first attribute to its end; true if it is one.
    fn test(&mut self, attrs: &[syn::Attribute], node: &impl Spanned) -> bool {
        if !is_test(attrs) {
            return false;
        }
        let start = attrs
            .first()
            .map_or(node.span().start().line, |a| a.span().start().line);
        self.test_lines.extend(start..=node.span().end().line);
        true
    }

    fn function(&mut self, ident: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
        let name = match self.owner.last() {
            Some(owner) => format!("{owner}::{ident}"),
            None => ident.to_string(),
        };
        let line = fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        self.functions.push(Function {
            name,
            line,
            lines: end - line + 1,
        });
    }
}

fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(String::new, |s| s.ident.to_string()),
        _ => "_".to_string(),
    }
}

impl<'a> Visit<'a> for Reader {
    fn visit_item(&mut self, i: &'a syn::Item) {
        let attrs: &[syn::Attribute] = match i {
            syn::Item::Const(x) => &x.attrs,
            syn::Item::Enum(x) => &x.attrs,
            syn::Item::Fn(x) => &x.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Macro(x) => &x.attrs,
            syn::Item::Mod(x) => &x.attrs,
            syn::Item::Static(x) => &x.attrs,
            syn::Item::Struct(x) => &x.attrs,
            syn::Item::Trait(x) => &x.attrs,
            syn::Item::Type(x) => &x.attrs,
            syn::Item::Union(x) => &x.attrs,
            syn::Item::Use(x) => &x.attrs,
            _ => &[],
        };
        if !self.test(attrs, i) {
            syn::visit::visit_item(self, i);
        } else if let syn::Item::Mod(m) = i
            && m.content.is_none()
        {
            self.test_modules.push(m.ident.to_string());
        }
    }

    fn visit_impl_item(&mut self, i: &'a syn::ImplItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::ImplItem::Const(x) => &x.attrs,
            syn::ImplItem::Fn(x) => &x.attrs,
            syn::ImplItem::Type(x) => &x.attrs,
            syn::ImplItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !self.test(attrs, i) {
            syn::visit::visit_impl_item(self, i);
        }
    }

    fn visit_field(&mut self, f: &'a syn::Field) {
        if !self.test(&f.attrs, f) {
            syn::visit::visit_field(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        self.owner.push(type_name(&i.self_ty));
        syn::visit::visit_item_impl(self, i);
        self.owner.pop();
    }

    fn visit_item_trait(&mut self, i: &'a syn::ItemTrait) {
        self.owner.push(i.ident.to_string());
        syn::visit::visit_item_trait(self, i);
        self.owner.pop();
    }

    fn visit_item_fn(&mut self, i: &'a syn::ItemFn) {
        // A function inside a method is its own, not the type's.
        let owners = std::mem::take(&mut self.owner);
        self.function(&i.sig.ident, &i.sig.fn_token, &i.block);
        syn::visit::visit_item_fn(self, i);
        self.owner = owners;
    }

    fn visit_impl_item_fn(&mut self, i: &'a syn::ImplItemFn) {
        self.function(&i.sig.ident, &i.sig.fn_token, &i.block);
        let owners = std::mem::take(&mut self.owner);
        syn::visit::visit_impl_item_fn(self, i);
        self.owner = owners;
    }

    fn visit_trait_item_fn(&mut self, i: &'a syn::TraitItemFn) {
        if let Some(block) = &i.default {
            self.function(&i.sig.ident, &i.sig.fn_token, block);
        }
        let owners = std::mem::take(&mut self.owner);
        syn::visit::visit_trait_item_fn(self, i);
        self.owner = owners;
    }
}
