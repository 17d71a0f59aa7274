//! The line diff a dry run prints: what a write would change in a file or an object, under
//! `--- label (before)` / `+++ label (after)`, each line `-`/`+`/` ` prefixed, every line or
//! only those near a change. One diff for every writer's dry run (`gpuslice configure`, the
//! console's allocate and edit).

/// The most lines [`diff`] aligns between the common head and tail (inserted plus deleted
/// lines); past it the lines between are shown removed and added whole, with a note, so that
/// the diff of any text costs bounded memory and time.
pub const DIFF_MAX_EDITS: usize = 1000;

/// Which unchanged lines a diff shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// Every line.
    All,
    /// Only those at most this many lines from a change; each run of lines left out is
    /// marked `@@ line N @@` before the next line shown, N its line number after the change.
    Lines(usize),
}

/// One line of a diff script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Keep,
    Del,
    Ins,
}

/// One row of a diff as printed.
enum Row<'a> {
    Keep(&'a str),
    Del(&'a str),
    Ins(&'a str),
    Note(String),
}

/// A line diff (shortest edit script) of `old` and `new`, `-`/`+`/` ` prefixed, under
/// `--- label (before)` and `+++ label (after)`, with the unchanged lines `context` keeps.
/// The common head and tail are trimmed first; the lines between are aligned with Myers'
/// O((N+M)·D) algorithm up to [`DIFF_MAX_EDITS`] edits, and in each run of changes the
/// removed lines come first.
pub fn diff(label: &str, old: &str, new: &str, context: Context) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut rows: Vec<Row> = a[..head].iter().map(|l| Row::Keep(l)).collect();
    match edit_script(ma, mb, DIFF_MAX_EDITS) {
        Some(script) => {
            let (mut i, mut j, mut k) = (0, 0, 0);
            while k < script.len() {
                if script[k] == Line::Keep {
                    rows.push(Row::Keep(ma[i]));
                    (i, j, k) = (i + 1, j + 1, k + 1);
                    continue;
                }
                // A run of changes: its removed lines, then its added lines.
                let run = script[k..].iter().take_while(|l| **l != Line::Keep);
                let (dels, ins) = run.fold((0, 0), |(d, n), l| match l {
                    Line::Del => (d + 1, n),
                    _ => (d, n + 1),
                });
                rows.extend(ma[i..i + dels].iter().map(|l| Row::Del(l)));
                rows.extend(mb[j..j + ins].iter().map(|l| Row::Ins(l)));
                (i, j, k) = (i + dels, j + ins, k + dels + ins);
            }
        }
        None => {
            rows.push(Row::Note(format!(
                "(more than {DIFF_MAX_EDITS} lines differ: the {} lines before and {} after between the common head and tail are shown whole)",
                ma.len(),
                mb.len()
            )));
            rows.extend(ma.iter().map(|l| Row::Del(l)));
            rows.extend(mb.iter().map(|l| Row::Ins(l)));
        }
    }
    rows.extend(a[a.len() - tail..].iter().map(|l| Row::Keep(l)));
    render(label, &rows, context)
}

/// `rows` as text under the diff's header, the unchanged rows `context` leaves out marked.
fn render(label: &str, rows: &[Row], context: Context) -> String {
    let shown: Vec<bool> = match context {
        Context::All => vec![true; rows.len()],
        Context::Lines(n) => {
            // Distance of each row to the nearest change before and after it.
            let mut shown = vec![false; rows.len()];
            let mut since = usize::MAX;
            for (s, r) in shown.iter_mut().zip(rows) {
                since = if matches!(r, Row::Keep(_)) {
                    since.saturating_add(1)
                } else {
                    0
                };
                *s = since <= n;
            }
            let mut until = usize::MAX;
            for (s, r) in shown.iter_mut().zip(rows).rev() {
                until = if matches!(r, Row::Keep(_)) {
                    until.saturating_add(1)
                } else {
                    0
                };
                *s |= until <= n;
            }
            shown
        }
    };
    let mut out = format!("--- {label} (before)\n+++ {label} (after)\n");
    // The line number after the change of the next row that takes one.
    let mut line_after = 1;
    let mut skipped = false;
    for (r, &show) in rows.iter().zip(&shown) {
        if !show {
            skipped = true;
        } else {
            if skipped {
                out.push_str(&format!("@@ line {line_after} @@\n"));
                skipped = false;
            }
            let (mark, text) = match r {
                Row::Keep(l) => (' ', *l),
                Row::Del(l) => ('-', *l),
                Row::Ins(l) => ('+', *l),
                Row::Note(n) => {
                    out.push_str(n);
                    out.push('\n');
                    continue;
                }
            };
            out.push(mark);
            out.push_str(text);
            out.push('\n');
        }
        if matches!(r, Row::Keep(_) | Row::Ins(_)) {
            line_after += 1;
        }
    }
    out
}

/// Myers' greedy shortest edit script from `a` to `b`, or `None` when it needs more than
/// `max_edits` inserted plus deleted lines. Memory: the furthest point of each diagonal per
/// edit count, at most (`max_edits` + 1)² entries.
fn edit_script(a: &[&str], b: &[&str], max_edits: usize) -> Option<Vec<Line>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (n + m).min(max_edits as isize);
    // v[k + off]: the furthest x reached on diagonal k = x - y; trace[d][k + d] its value
    // after d edits.
    let off = max + 1;
    let mut v = vec![0isize; (2 * max + 3) as usize];
    let at = |k: isize| (k + off) as usize;
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'steps: for d in 0..=max {
        for k in (-d..=d).step_by(2) {
            let mut x = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
                v[at(k + 1)]
            } else {
                v[at(k - 1)] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[at(k)] = x;
            if x >= n && y >= m {
                trace.push(v[at(-d)..=at(d)].to_vec());
                found = Some(d);
                break 'steps;
            }
        }
        trace.push(v[at(-d)..=at(d)].to_vec());
    }
    let d_end = found?;
    // Back from (n, m): each edit count's step, the snake after it as kept lines.
    let mut script = Vec::with_capacity((n + m) as usize);
    let (mut x, mut y) = (n, m);
    for d in (1..=d_end).rev() {
        let prev = &trace[(d - 1) as usize];
        let get = |k: isize| prev[(k + d - 1) as usize];
        let k = x - y;
        let down = k == -d || (k != d && get(k - 1) < get(k + 1));
        let pk = if down { k + 1 } else { k - 1 };
        let px = get(pk);
        let py = px - pk;
        let (sx, sy) = if down { (px, py + 1) } else { (px + 1, py) };
        while x > sx && y > sy {
            script.push(Line::Keep);
            x -= 1;
            y -= 1;
        }
        script.push(if down { Line::Ins } else { Line::Del });
        (x, y) = (px, py);
    }
    script.extend(std::iter::repeat_n(Line::Keep, x as usize));
    script.reverse();
    Some(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The diff with every line.
    fn whole(label: &str, old: &str, new: &str) -> String {
        diff(label, old, new, Context::All)
    }

    #[test]
    fn only_the_lines_near_a_change_are_kept_the_others_marked() {
        let old: String = (1..=20).map(|i| format!("l{i}\n")).collect();
        let new = old.replace("l5\n", "l5\nNEW\n").replace("l16\n", "");
        assert_eq!(
            diff("f", &old, &new, Context::Lines(2)),
            "--- f (before)\n+++ f (after)\n@@ line 4 @@\n l4\n l5\n+NEW\n l6\n l7\n@@ line 15 @@\n l14\n l15\n-l16\n l17\n l18\n"
        );
        assert_eq!(
            diff("f", "a\nb\nc\n", "a\nx\nb\nc\n", Context::Lines(0)),
            "--- f (before)\n+++ f (after)\n@@ line 2 @@\n+x\n"
        );
        // Context reaching the ends leaves no mark.
        assert_eq!(
            diff("f", "a\nb\n", "a\nc\n", Context::Lines(3)),
            whole("f", "a\nb\n", "a\nc\n")
        );
    }

    #[test]
    fn the_diff_keeps_context_and_marks_changes() {
        let d = whole("x", "a\nb\nc\n", "a\nB\nc\nd\n");
        assert_eq!(d, "--- x (before)\n+++ x (after)\n a\n-b\n+B\n c\n+d\n");
        assert_eq!(whole("y", "", "n\n"), "--- y (before)\n+++ y (after)\n+n\n");
        assert_eq!(whole("z", "a\n", ""), "--- z (before)\n+++ z (after)\n-a\n");
        assert_eq!(
            whole("z", "a\n", "a\n"),
            "--- z (before)\n+++ z (after)\n a\n"
        );
    }

    /// The lines of `d` (past its header) marked ` ` or `mark`, unmarked, and how many lines
    /// carry `-` or `+`.
    fn side(d: &str, mark: char) -> (Vec<String>, usize) {
        let body = d.lines().skip(2);
        let lines = body
            .clone()
            .filter(|l| l.starts_with(' ') || l.starts_with(mark))
            .map(|l| l[1..].to_string())
            .collect();
        let edits = body
            .filter(|l| l.starts_with('-') || l.starts_with('+'))
            .count();
        (lines, edits)
    }

    /// The length of the longest common subsequence, the slow way: the reference for the
    /// fewest lines a diff can mark.
    fn lcs_len(a: &[String], b: &[String]) -> usize {
        let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                t[i][j] = if a[i] == b[j] {
                    t[i + 1][j + 1] + 1
                } else {
                    t[i + 1][j].max(t[i][j + 1])
                };
            }
        }
        t[0][0]
    }

    /// Checks that `d` is a diff of `a` to `b` marking the fewest lines.
    fn assert_minimal_diff(d: &str, a: &[String], b: &[String]) {
        let (before, edits) = side(d, '-');
        let (after, _) = side(d, '+');
        assert_eq!(before, a, "{d}");
        assert_eq!(after, b, "{d}");
        assert_eq!(edits, a.len() + b.len() - 2 * lcs_len(a, b), "{d}");
    }

    #[test]
    fn the_diff_marks_the_fewest_lines() {
        // Small inputs over three distinct lines, so that many alignments tie.
        let mut seed: u64 = 7;
        let mut next = |bound: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % bound
        };
        for _ in 0..500 {
            let mut text = || -> Vec<String> {
                (0..next(12))
                    .map(|_| ["x", "y", "z"][next(3) as usize].to_string())
                    .collect()
            };
            let (a, b) = (text(), text());
            let join = |v: &[String]| v.iter().map(|l| format!("{l}\n")).collect::<String>();
            assert_minimal_diff(&whole("t", &join(&a), &join(&b)), &a, &b);
        }
        // Many separate changes between a common head and tail: 300 replaced lines.
        let a: Vec<String> = (0..1200).map(|i| format!("line {i}")).collect();
        let b: Vec<String> = (0..1200)
            .map(|i| {
                if i % 4 == 1 {
                    format!("new {i}")
                } else {
                    format!("line {i}")
                }
            })
            .collect();
        let d = whole("t", &(a.join("\n") + "\n"), &(b.join("\n") + "\n"));
        assert!(d.contains(" line 0\n-line 1\n+new 1\n line 2\n"), "{d}");
        assert_minimal_diff(&d, &a, &b);
    }

    #[test]
    fn a_small_change_to_a_huge_template_diffs_in_bounded_memory() {
        // 50k lines each side: a table of the two line counts would take 20 GB.
        let lines: Vec<String> = (0..50_000).map(|i| format!("  - name: VAR_{i}")).collect();
        let old = lines.join("\n") + "\n";
        let mut changed = lines.clone();
        changed[25_000] = "  - name: CHANGED".to_string();
        changed.insert(40_000, "  - name: ADDED".to_string());
        let new = changed.join("\n") + "\n";
        let d = whole("deployment/web spec.template.spec", &old, &new);
        let mut want = String::from(
            "--- deployment/web spec.template.spec (before)\n+++ deployment/web spec.template.spec (after)\n",
        );
        for (i, l) in lines.iter().enumerate() {
            match i {
                25_000 => want.push_str(&format!("-{l}\n+  - name: CHANGED\n")),
                40_000 => want.push_str(&format!("+  - name: ADDED\n {l}\n")),
                _ => want.push_str(&format!(" {l}\n")),
            }
        }
        assert!(
            d == want,
            "the diff of the huge template is not the expected one"
        );
    }

    #[test]
    fn past_the_edit_cap_the_lines_between_are_shown_whole_with_a_note() {
        let n = DIFF_MAX_EDITS;
        let old: String = std::iter::once("head".to_string())
            .chain((0..n).map(|i| format!("a{i}")))
            .chain(std::iter::once("tail".to_string()))
            .map(|l| l + "\n")
            .collect();
        let new: String = std::iter::once("head".to_string())
            .chain((0..n).map(|i| format!("b{i}")))
            .chain(std::iter::once("tail".to_string()))
            .map(|l| l + "\n")
            .collect();
        let d = whole("x", &old, &new);
        let mut want = format!(
            "--- x (before)\n+++ x (after)\n head\n(more than {n} lines differ: the {n} lines before and {n} after between the common head and tail are shown whole)\n"
        );
        for i in 0..n {
            want.push_str(&format!("-a{i}\n"));
        }
        for i in 0..n {
            want.push_str(&format!("+b{i}\n"));
        }
        want.push_str(" tail\n");
        assert_eq!(d, want);
        // At the cap itself the lines are still aligned: no note.
        let half = n / 2;
        let cut = |s: &str| -> String {
            s.lines()
                .filter(|l| !l[1..].parse::<usize>().is_ok_and(|i| i >= half))
                .map(|l| format!("{l}\n"))
                .collect()
        };
        let d = whole("x", &cut(&old), &cut(&new));
        assert!(!d.contains("more than"), "{d}");
        let removed = d.lines().skip(2).filter(|l| l.starts_with('-')).count();
        assert_eq!(removed, half, "{d}");
    }
}
