//! The house a reader enters: no file under `src/` holds more than a thousand lines of
//! production code, and no production function is longer than a screen unless it is a
//! table. `cargo test --test house -- --nocapture` prints the measures.

#[path = "common/source.rs"]
mod source;

/// A file's production code a reader can hold: about a thousand lines.
const FILE_LINES: usize = 1000;
/// A screen.
const FUNCTION_LINES: usize = 80;

/// Functions longer than a screen because they are a table: one arm or one entry per
/// case, nothing to follow from line to line.
const TABLES: &[(&str, &str)] = &[];

#[test]
fn no_file_holds_more_than_a_thousand_lines_of_production_code() {
    let mut files: Vec<_> = source::all()
        .into_iter()
        .map(|s| (s.production_lines(), s.test_lines.len(), s.rel))
        .collect();
    files.sort_by(|a, b| b.cmp(a));
    println!("{:>6} {:>6}  file (production, test lines)", "prod", "test");
    for (prod, test, rel) in &files {
        println!("{prod:>6} {test:>6}  {rel}");
    }
    let over: Vec<_> = files
        .iter()
        .filter(|(prod, _, _)| *prod > FILE_LINES)
        .map(|(prod, _, rel)| format!("{rel}: {prod} lines of production code"))
        .collect();
    assert!(over.is_empty(), "over {FILE_LINES} lines: {over:#?}");
}

#[test]
fn no_production_function_is_longer_than_a_screen() {
    let mut functions = Vec::new();
    for s in source::all() {
        for f in s.functions {
            functions.push((f.lines, format!("{}:{}", s.rel, f.line), f.name));
        }
    }
    functions.sort_by(|a, b| b.cmp(a));
    println!("{:>5}  function", "lines");
    for (lines, at, name) in functions.iter().take(40) {
        println!("{lines:>5}  {name} ({at})");
    }
    let over: Vec<_> = functions
        .iter()
        .filter(|(lines, _, name)| {
            *lines > FUNCTION_LINES && !TABLES.iter().any(|(t, _)| t == name)
        })
        .map(|(lines, at, name)| format!("{name} ({at}): {lines} lines"))
        .collect();
    assert!(
        over.is_empty(),
        "longer than {FUNCTION_LINES} lines: {over:#?}"
    );
    for (table, why) in TABLES {
        assert!(
            functions.iter().any(|(_, _, name)| name == table),
            "TABLES names {table} ({why}), which is not a function under src/"
        );
    }
}
