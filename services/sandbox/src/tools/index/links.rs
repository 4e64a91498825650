//! Which files of a tree a file imports, by per-language line patterns.
//!
//! A question's answer is seldom one file: the leading file calls a helper
//! module, or is a submodule of the module that declares it. The index
//! records, for each file, the files of the tree it names in its imports:
//! Rust `mod` declarations and `use crate::`/`super::`/`self::` paths,
//! Python relative and absolute `import`s, JavaScript and TypeScript
//! relative `import`/`require` specifiers, Java and Kotlin `import`s and
//! the classes of the same package a file names (a Java class lives in the
//! file of its name), and in Go (whose package is one scope) the file of
//! the same directory that alone defines a top-level name a file uses. Only
//! paths that exist in the tree become links; packages from outside the
//! repository are not followed.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use regex::Regex;

use crate::repo_paths::{join, parent};

/// What a file says about another file of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reference {
    /// One of these paths, the first that exists (a Rust module is
    /// `x.rs` or `x/mod.rs`, a JavaScript specifier has one of several
    /// extensions).
    OneOf(Vec<String>),
    /// A file whose path ends with this (a Python absolute module, a Java
    /// class by its package): every file so named, up to
    /// [`MAX_SUFFIX_MATCHES`].
    EndingWith(String),
    /// Classes named in the file, matched to the files of the same
    /// directory named after them (Java, Kotlin).
    SiblingClasses(BTreeSet<String>),
    /// A Go file's top-level names (functions, methods, types, variables,
    /// constants) and the other names it uses: a package's files share one
    /// scope, so a file links to the file of its directory that alone
    /// defines a name it uses.
    GoNames {
        defines: BTreeSet<String>,
        uses: BTreeSet<String>,
    },
}

/// A suffix matching more files than this names none of them for sure.
const MAX_SUFFIX_MATCHES: usize = 2;
/// Classes a file may name that are looked up among its siblings.
const MAX_SIBLING_CLASSES: usize = 400;
/// A `use` statement longer than this (in lines) is not followed further;
/// one longer than this in bytes, or nested deeper in braces, not at all
/// (repository content is untrusted: no statement costs more than these).
const MAX_USE_LINES: usize = 40;
const MAX_USE_BYTES: usize = 8_192;
const MAX_USE_DEPTH: usize = 8;
/// Path segments of a `use` looked up (a module path is never deeper).
const MAX_USE_SEGMENTS: usize = 12;

const JS_EXTENSIONS: &[&str] = &["ts", "tsx", "mts", "cts", "js", "jsx", "mjs", "cjs"];

/// The line patterns, compiled once (`None` only were one invalid, which
/// the tests rule out: then no file links to another).
struct Patterns {
    rust_mod: Regex,
    rust_use_start: Regex,
    python_from: Regex,
    python_import: Regex,
    js_specifier: Regex,
    jvm_import: Regex,
    class_name: Regex,
    go_definition: Regex,
    go_name: Regex,
}

static PATTERNS: LazyLock<Option<Patterns>> = LazyLock::new(|| {
    Some(Patterns {
        rust_mod: Regex::new(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
            .ok()?,
        rust_use_start: Regex::new(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+").ok()?,
        python_from: Regex::new(r"^\s*from\s+(\.*)([A-Za-z_][\w.]*)?\s+import\s+\(?\s*([^#]*)")
            .ok()?,
        python_import: Regex::new(r"^\s*import\s+([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)")
            .ok()?,
        js_specifier: Regex::new(
            r#"(?:\bfrom\s*|\brequire\s*\(\s*|\bimport\s*\(\s*|^\s*import\s+|^\s*export\s+\*\s+from\s+)['"](\.{1,2}/[^'"]*)['"]"#,
        )
        .ok()?,
        jvm_import: Regex::new(r"^\s*import\s+(static\s+)?([A-Za-z_][\w.]*)\s*;?").ok()?,
        class_name: Regex::new(r"\b[A-Z][A-Za-z0-9_]*[a-z][A-Za-z0-9_]*\b").ok()?,
        go_definition: Regex::new(
            r"^(?:func\s+(?:\([^)]*\)\s*)?|type\s+|var\s+|const\s+)([A-Za-z_][A-Za-z0-9_]*)",
        )
        .ok()?,
        go_name: Regex::new(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b").ok()?,
    })
});

fn extension(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.rsplit_once('.').map_or("", |(_, extension)| extension)
}

/// `a/b/../c/./d` as `a/c/d`; `None` when it climbs out of the tree.
fn normalized(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// What `path`'s text says of other files, by its language.
pub(super) fn references(path: &str, text: &str) -> Vec<Reference> {
    let Some(patterns) = PATTERNS.as_ref() else {
        return Vec::new();
    };
    match extension(path) {
        "rs" => rust_references(patterns, path, text),
        "py" | "pyi" => python_references(patterns, path, text),
        extension if JS_EXTENSIONS.contains(&extension) => js_references(patterns, path, text),
        "java" | "kt" => jvm_references(patterns, text),
        "go" => go_references(patterns, text),
        _ => Vec::new(),
    }
}

/// The directory a Rust file's child modules live in: its own directory
/// for `mod.rs`, `lib.rs` and `main.rs`, else the directory of its name.
fn rust_module_directory(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name {
        "mod.rs" | "lib.rs" | "main.rs" => parent(path).to_owned(),
        _ => join(parent(path), name.trim_end_matches(".rs")),
    }
}

/// The directory of the crate's root module: the nearest `src` above the
/// file, else the file's own top directory.
fn rust_crate_directory(path: &str) -> String {
    let directory = parent(path);
    let parts: Vec<&str> = directory.split('/').collect();
    match parts.iter().rposition(|part| *part == "src") {
        Some(at) => parts[..=at].join("/"),
        None => parts
            .first()
            .map_or(String::new(), |first| (*first).to_owned()),
    }
}

/// Module files for `segments` under `base`, longest path first: the
/// module a `use` names may be any prefix of its path (the rest are items),
/// down to the module of `base` itself (`super::Epoch` is an item of the
/// parent module's file).
fn rust_module_files(base: &str, segments: &[&str]) -> Vec<String> {
    let mut candidates = Vec::new();
    for length in (1..=segments.len()).rev() {
        let module = join(base, &segments[..length].join("/"));
        candidates.push(format!("{module}.rs"));
        candidates.push(format!("{module}/mod.rs"));
    }
    for root in ["mod.rs", "lib.rs", "main.rs"] {
        candidates.push(join(base, root));
    }
    if !base.is_empty() {
        candidates.push(format!("{base}.rs"));
    }
    candidates
}

/// A `use` tree's paths: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`;
/// nothing below [`MAX_USE_DEPTH`] levels of braces.
fn use_paths(tree: &str, depth: usize) -> Vec<String> {
    if depth > MAX_USE_DEPTH {
        return Vec::new();
    }
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return if path.is_empty() {
            Vec::new()
        } else {
            vec![path.to_owned()]
        };
    };
    let prefix = tree[..open].trim_end_matches("::").trim();
    let Some(close) = tree.rfind('}') else {
        return Vec::new();
    };
    let inner = &tree[open + 1..close.max(open + 1)];
    let mut items = Vec::new();
    let mut nesting = 0;
    let mut start = 0;
    for (at, c) in inner.char_indices() {
        match c {
            '{' => nesting += 1,
            '}' => nesting -= 1,
            ',' if nesting == 0 => {
                items.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .flat_map(|item| use_paths(item, depth + 1))
        .map(|path| match (prefix.is_empty(), path.as_str()) {
            (true, _) => path,
            (false, "self") => prefix.to_owned(),
            (false, _) => format!("{prefix}::{path}"),
        })
        .collect()
}

fn rust_references(patterns: &Patterns, path: &str, text: &str) -> Vec<Reference> {
    let module_directory = rust_module_directory(path);
    let crate_directory = rust_crate_directory(path);
    // `super` of `src/db/dir.rs` is `src/db` (the module `db`); of
    // `src/db/mod.rs`, the crate root's directory `src`.
    let parent_directory = {
        let name = path.rsplit('/').next().unwrap_or(path);
        if name == "mod.rs" {
            parent(parent(path)).to_owned()
        } else {
            parent(path).to_owned()
        }
    };
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        at += 1;
        if let Some(captures) = patterns.rust_mod.captures(line) {
            let module = join(&module_directory, &captures[1]);
            out.push(Reference::OneOf(vec![
                format!("{module}.rs"),
                format!("{module}/mod.rs"),
            ]));
            continue;
        }
        let Some(start) = patterns.rust_use_start.find(line) else {
            continue;
        };
        let mut statement = line[start.end()..].to_owned();
        let mut ended = statement.contains(';');
        let mut taken = 1;
        while !ended
            && at < lines.len()
            && taken < MAX_USE_LINES
            && statement.len() <= MAX_USE_BYTES
        {
            ended = lines[at].contains(';');
            statement.push(' ');
            statement.push_str(lines[at]);
            at += 1;
            taken += 1;
        }
        let statement = statement.split(';').next().unwrap_or_default();
        if statement.len() > MAX_USE_BYTES {
            continue;
        }
        for used in use_paths(statement, 0) {
            let segments: Vec<&str> = used
                .split("::")
                .map(str::trim)
                .take(MAX_USE_SEGMENTS)
                .collect();
            let (base, rest) = match segments.first() {
                Some(&"crate") => (crate_directory.as_str(), &segments[1..]),
                Some(&"super") => (parent_directory.as_str(), &segments[1..]),
                Some(&"self") => (module_directory.as_str(), &segments[1..]),
                Some(&("std" | "core" | "alloc")) => continue,
                // `use dir::Dir` in a module that declares `mod dir`
                // (an outside crate's name resolves to no file).
                _ => (module_directory.as_str(), &segments[..]),
            };
            let relative = !matches!(segments.first(), Some(&("crate" | "super" | "self")));
            let rest: Vec<&str> = rest
                .iter()
                .copied()
                .filter(|segment| *segment != "*" && !segment.is_empty())
                .collect();
            if relative {
                // Only a child module's own file: never the module's own root.
                if let Some(child) = rest.first() {
                    let module = join(base, child);
                    out.push(Reference::OneOf(vec![
                        format!("{module}.rs"),
                        format!("{module}/mod.rs"),
                    ]));
                }
            } else if !rest.is_empty() {
                out.push(Reference::OneOf(rust_module_files(base, &rest)));
            }
        }
    }
    out
}

/// The names a Python `from … import` brings in: `a, b as c, (d` is
/// `a`, `b`, `d`.
fn python_names(names: &str) -> Vec<&str> {
    names
        .split(',')
        .filter_map(|name| {
            let name = name.trim().trim_start_matches('(').trim_end_matches(')');
            let name = name.split_whitespace().next()?;
            (name != "*" && name.chars().all(|c| c.is_alphanumeric() || c == '_')).then_some(name)
        })
        .collect()
}

fn python_references(patterns: &Patterns, path: &str, text: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(captures) = patterns.python_from.captures(line) {
            let dots = captures[1].len();
            let module = captures.get(2).map_or("", |m| m.as_str()).replace('.', "/");
            let names = python_names(captures.get(3).map_or("", |m| m.as_str()));
            if dots > 0 {
                let mut base = parent(path).to_owned();
                for _ in 1..dots {
                    base = parent(&base).to_owned();
                }
                let module = join(&base, &module);
                let module = module.trim_end_matches('/');
                // `from . import x` names the submodule `x`, not the package.
                if captures.get(2).is_some() {
                    out.push(Reference::OneOf(vec![
                        format!("{module}.py"),
                        format!("{module}/__init__.py"),
                    ]));
                }
                for name in names {
                    out.push(Reference::OneOf(vec![join(module, &format!("{name}.py"))]));
                }
            } else if !module.is_empty() {
                out.push(Reference::EndingWith(format!("{module}.py")));
                out.push(Reference::EndingWith(format!("{module}/__init__.py")));
                for name in names {
                    out.push(Reference::EndingWith(format!("{module}/{name}.py")));
                }
            }
        } else if let Some(captures) = patterns.python_import.captures(line) {
            for module in captures[1].split(',') {
                let module = module.trim().replace('.', "/");
                out.push(Reference::EndingWith(format!("{module}.py")));
                out.push(Reference::EndingWith(format!("{module}/__init__.py")));
            }
        }
    }
    out
}

fn js_references(patterns: &Patterns, path: &str, text: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    for line in text.lines() {
        for captures in patterns.js_specifier.captures_iter(line) {
            let Some(target) = normalized(&join(parent(path), &captures[1])) else {
                continue;
            };
            // TypeScript imports `./x.js` for the source `./x.ts`.
            let bare = JS_EXTENSIONS
                .iter()
                .find_map(|extension| target.strip_suffix(&format!(".{extension}")))
                .unwrap_or(&target);
            let mut candidates = vec![target.clone()];
            for extension in JS_EXTENSIONS {
                candidates.push(format!("{bare}.{extension}"));
            }
            for extension in JS_EXTENSIONS {
                candidates.push(join(bare, &format!("index.{extension}")));
            }
            out.push(Reference::OneOf(candidates));
        }
    }
    out
}

/// Adds the names `pattern` finds in `line` before a `//` comment to
/// `names`, while it holds fewer than `most`.
fn names_in_code(pattern: &Regex, line: &str, most: usize, names: &mut BTreeSet<String>) {
    let code = line.split("//").next().unwrap_or(line);
    for name in pattern.find_iter(code) {
        if names.len() >= most {
            break;
        }
        names.insert(name.as_str().to_owned());
    }
}

fn jvm_references(patterns: &Patterns, text: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    let mut classes = BTreeSet::new();
    for line in text.lines() {
        if let Some(captures) = patterns.jvm_import.captures(line) {
            let mut parts: Vec<&str> = captures[2].split('.').collect();
            if captures.get(1).is_some() {
                // `import static a.b.C.member`: the class is `a.b.C`.
                parts.pop();
            }
            if parts.last() != Some(&"*") && parts.len() > 1 {
                let class = parts.join("/");
                out.push(Reference::EndingWith(format!("{class}.java")));
                out.push(Reference::EndingWith(format!("{class}.kt")));
            }
            continue;
        }
        names_in_code(
            &patterns.class_name,
            line,
            MAX_SIBLING_CLASSES,
            &mut classes,
        );
    }
    if !classes.is_empty() {
        out.push(Reference::SiblingClasses(classes));
    }
    out
}

/// Names shorter than this are too common to link Go files by.
const GO_NAME_MIN_CHARS: usize = 4;
/// Names a Go file may use that are looked up among its package's.
const MAX_GO_NAMES: usize = 2_000;

fn go_references(patterns: &Patterns, text: &str) -> Vec<Reference> {
    let mut defines = BTreeSet::new();
    let mut uses = BTreeSet::new();
    for line in text.lines() {
        if let Some(captures) = patterns.go_definition.captures(line) {
            let name = &captures[1];
            if name.len() >= GO_NAME_MIN_CHARS {
                defines.insert(name.to_owned());
            }
        }
        names_in_code(&patterns.go_name, line, MAX_GO_NAMES, &mut uses);
    }
    let uses = uses.difference(&defines).cloned().collect();
    vec![Reference::GoNames { defines, uses }]
}

/// Resolves references to the files of a tree.
pub(super) struct Resolver<'a> {
    paths: &'a [&'a str],
    by_path: HashMap<&'a str, u32>,
    /// File name → files so named.
    by_name: HashMap<&'a str, Vec<u32>>,
    /// Directory → (file stem, file) of its Java and Kotlin files.
    classes_by_directory: HashMap<&'a str, Vec<(&'a str, u32)>>,
    /// Directory → Go name → the files of that directory defining it.
    go_names_by_directory: HashMap<&'a str, HashMap<&'a str, Vec<u32>>>,
}

impl<'a> Resolver<'a> {
    /// The resolver of the tree of `paths`, each with its references.
    pub(super) fn new(paths: &'a [&'a str], references: &'a [Vec<Reference>]) -> Self {
        let mut by_path = HashMap::new();
        let mut by_name: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut classes_by_directory: HashMap<&str, Vec<(&str, u32)>> = HashMap::new();
        for (index, path) in paths.iter().enumerate() {
            let index = index as u32;
            by_path.insert(*path, index);
            let name = path.rsplit('/').next().unwrap_or(path);
            by_name.entry(name).or_default().push(index);
            if let Some(stem) = name
                .strip_suffix(".java")
                .or_else(|| name.strip_suffix(".kt"))
            {
                classes_by_directory
                    .entry(parent(path))
                    .or_default()
                    .push((stem, index));
            }
        }
        let mut go_names_by_directory: HashMap<&str, HashMap<&str, Vec<u32>>> = HashMap::new();
        for (index, (path, references)) in paths.iter().zip(references).enumerate() {
            for reference in references {
                if let Reference::GoNames { defines, .. } = reference {
                    let names = go_names_by_directory.entry(parent(path)).or_default();
                    for name in defines {
                        names.entry(name.as_str()).or_default().push(index as u32);
                    }
                }
            }
        }
        Self {
            paths,
            by_path,
            by_name,
            classes_by_directory,
            go_names_by_directory,
        }
    }

    /// The files `path`'s references name (never `path` itself), in file order.
    pub(super) fn resolve(&self, path: &str, references: &[Reference]) -> Vec<u32> {
        let this = self.by_path.get(path).copied();
        let mut linked = BTreeSet::new();
        for reference in references {
            match reference {
                Reference::OneOf(candidates) => {
                    if let Some(found) = candidates
                        .iter()
                        .find_map(|candidate| self.by_path.get(candidate.as_str()))
                    {
                        linked.insert(*found);
                    }
                }
                Reference::EndingWith(suffix) => {
                    let name = suffix.rsplit('/').next().unwrap_or(suffix);
                    let matching: Vec<u32> = self
                        .by_name
                        .get(name)
                        .into_iter()
                        .flatten()
                        .copied()
                        .filter(|index| {
                            let candidate = self.paths[*index as usize];
                            candidate == suffix
                                || candidate
                                    .strip_suffix(suffix.as_str())
                                    .is_some_and(|before| before.ends_with('/'))
                        })
                        .collect();
                    if matching.len() <= MAX_SUFFIX_MATCHES {
                        linked.extend(matching);
                    }
                }
                Reference::SiblingClasses(classes) => {
                    for (stem, index) in self
                        .classes_by_directory
                        .get(parent(path))
                        .into_iter()
                        .flatten()
                    {
                        if classes.contains(*stem) {
                            linked.insert(*index);
                        }
                    }
                }
                Reference::GoNames { uses, .. } => {
                    let Some(names) = self.go_names_by_directory.get(parent(path)) else {
                        continue;
                    };
                    for name in uses {
                        if let Some([only]) = names.get(name.as_str()).map(Vec::as_slice) {
                            linked.insert(*only);
                        }
                    }
                }
            }
        }
        if let Some(this) = this {
            linked.remove(&this);
        }
        linked.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linked(files: &[(&str, &str)], from: &str) -> Vec<String> {
        let paths: Vec<&str> = files.iter().map(|(path, _)| *path).collect();
        let all: Vec<Vec<Reference>> = files
            .iter()
            .map(|(path, text)| references(path, text))
            .collect();
        let resolver = Resolver::new(&paths, &all);
        let at = paths.iter().position(|path| *path == from).unwrap();
        resolver
            .resolve(from, &all[at])
            .into_iter()
            .map(|index| paths[index as usize].to_owned())
            .collect()
    }

    #[test]
    fn rust_modules_and_use_paths_link_to_their_files() {
        let files = [
            ("src/main.rs", "mod db;\nmod util;\n"),
            (
                "src/db/mod.rs",
                "mod dir;\npub use dir::Dir;\nuse crate::{\n    config,\n    util::{self, write},\n};\n",
            ),
            (
                "src/db/dir.rs",
                "use super::Epoch;\nuse crate::db::stream::Stream;\n",
            ),
            ("src/db/stream.rs", ""),
            ("src/config.rs", ""),
            ("src/util.rs", "use std::fs;\nuse anyhow::Result;\n"),
        ];
        assert_eq!(
            linked(&files, "src/main.rs"),
            ["src/db/mod.rs", "src/util.rs"]
        );
        assert_eq!(
            linked(&files, "src/db/mod.rs"),
            ["src/db/dir.rs", "src/config.rs", "src/util.rs"]
        );
        assert_eq!(
            linked(&files, "src/db/dir.rs"),
            ["src/db/mod.rs", "src/db/stream.rs"]
        );
        assert!(
            linked(&files, "src/util.rs").is_empty(),
            "std and crates are not files"
        );
    }

    #[test]
    fn python_relative_and_absolute_imports_link_to_their_modules() {
        let files = [
            (
                "src/click/utils.py",
                "from ._compat import open_stream\nfrom . import types\nimport click.parser\n",
            ),
            ("src/click/_compat.py", ""),
            (
                "src/click/types.py",
                "from .utils import (\n    safecall,\n)\n",
            ),
            ("src/click/parser.py", ""),
            (
                "src/click/__init__.py",
                "from .core import Command as Command\n",
            ),
            ("src/click/core.py", ""),
        ];
        assert_eq!(
            linked(&files, "src/click/utils.py"),
            [
                "src/click/_compat.py",
                "src/click/types.py",
                "src/click/parser.py"
            ]
        );
        assert_eq!(linked(&files, "src/click/types.py"), ["src/click/utils.py"]);
        assert_eq!(
            linked(&files, "src/click/__init__.py"),
            ["src/click/core.py"]
        );
    }

    #[test]
    fn javascript_and_typescript_relative_specifiers_link_to_their_files() {
        let files = [
            (
                "lib/command.js",
                "const { CommanderError } = require('./error.js');\nconst help = require('./help');\nconst path = require('node:path');\n",
            ),
            ("lib/error.js", ""),
            ("lib/help.js", ""),
            (
                "src/index.ts",
                "import { externalPlugin } from './esbuild/external.js'\nimport { run } from './esbuild'\nexport * from './options'\n",
            ),
            ("src/esbuild/external.ts", ""),
            (
                "src/esbuild/index.ts",
                "import { x } from '../../../outside'\n",
            ),
            ("src/options.ts", ""),
        ];
        assert_eq!(
            linked(&files, "lib/command.js"),
            ["lib/error.js", "lib/help.js"]
        );
        assert_eq!(
            linked(&files, "src/index.ts"),
            [
                "src/esbuild/external.ts",
                "src/esbuild/index.ts",
                "src/options.ts"
            ]
        );
        assert!(linked(&files, "src/esbuild/index.ts").is_empty());
    }

    #[test]
    fn java_imports_and_classes_of_the_same_package_link_to_their_files() {
        let files = [
            (
                "src/main/java/com/lmax/disruptor/BatchEventProcessor.java",
                "package com.lmax.disruptor;\nimport com.lmax.disruptor.util.Util;\n// see FatalExceptionHandler\nclass BatchEventProcessor {\n    ExceptionHandler<T> handler = ExceptionHandlers.defaultHandler();\n}\n",
            ),
            (
                "src/main/java/com/lmax/disruptor/ExceptionHandlers.java",
                "",
            ),
            ("src/main/java/com/lmax/disruptor/ExceptionHandler.java", ""),
            (
                "src/main/java/com/lmax/disruptor/FatalExceptionHandler.java",
                "",
            ),
            ("src/main/java/com/lmax/disruptor/util/Util.java", ""),
        ];
        assert_eq!(
            linked(
                &files,
                "src/main/java/com/lmax/disruptor/BatchEventProcessor.java"
            ),
            [
                "src/main/java/com/lmax/disruptor/ExceptionHandlers.java",
                "src/main/java/com/lmax/disruptor/ExceptionHandler.java",
                "src/main/java/com/lmax/disruptor/util/Util.java",
            ],
            "a class named only in a comment is no link"
        );
    }

    #[test]
    fn a_go_file_links_to_the_file_of_its_package_that_alone_defines_a_name_it_uses() {
        let files = [
            (
                "mux.go",
                "package chi\n\nfunc (mx *Mux) Mount(pattern string) {\n\tmx.tree.FindRoute(rctx, pattern)\n\tmx.handle(pattern)\n}\n// see RouteContext\nfunc (mx *Mux) ServeHTTP() {}\n",
            ),
            (
                "tree.go",
                "package chi\n\ntype node struct{}\n\nfunc (n *node) FindRoute(rctx *Context, path string) {}\n",
            ),
            ("context.go", "package chi\n\nfunc RouteContext() {}\n"),
            (
                "middleware/strip.go",
                "package middleware\n\nfunc (s *Strip) ServeHTTP() { FindRoute() }\n",
            ),
            ("chi.go", "package chi\n\nfunc (r *Router) ServeHTTP() {}\n"),
        ];
        // ServeHTTP is defined twice (no link), RouteContext only named in a
        // comment, FindRoute in another package for strip.go.
        assert_eq!(linked(&files, "mux.go"), ["tree.go"]);
        assert!(linked(&files, "middleware/strip.go").is_empty());
    }

    #[test]
    fn a_hostile_use_statement_costs_no_more_than_its_bounds() {
        // Braces nested a thousand deep (within the byte bound), and a path
        // of a hundred thousand segments (over it).
        let deep = format!(
            "use crate::{}x{};\n",
            "a::{".repeat(1_000),
            "}".repeat(1_000)
        );
        assert!(deep.len() < MAX_USE_BYTES);
        let long = format!("use crate::{}x;\n", "a::".repeat(100_000));
        let files = [("src/lib.rs", deep.as_str()), ("src/a.rs", long.as_str())];
        assert!(linked(&files, "src/lib.rs").is_empty());
        assert!(linked(&files, "src/a.rs").is_empty());
        let nested = format!("use crate::{}a{};\n", "{".repeat(4), "}".repeat(4));
        let files = [("src/lib.rs", nested.as_str()), ("src/a.rs", "")];
        assert_eq!(
            linked(&files, "src/lib.rs"),
            ["src/a.rs"],
            "within the bounds"
        );
    }

    #[test]
    fn every_pattern_compiles() {
        assert!(PATTERNS.is_some());
    }

    #[test]
    fn paths_climbing_out_of_the_tree_are_no_paths() {
        assert_eq!(normalized("a/b/../c/./d").as_deref(), Some("a/c/d"));
        assert_eq!(normalized("a/../../b"), None);
        assert_eq!(
            use_paths("crate::{a, b::{c, self}, d as e}", 0),
            ["crate::a", "crate::b::c", "crate::b", "crate::d"]
        );
    }
}
