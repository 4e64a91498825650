//! Inline SVG diagrams from a section's nodes and directed edges.
//!
//! Layout is a simple layered one: cycles are broken by dropping DFS back
//! edges, each node's layer is its longest path from a source, and each layer
//! becomes one or more rows of at most [`COLUMNS_MAX`] boxes. Arrows are
//! cubic curves with explicit arrowhead polygons (no markers, so no `url()`
//! references). Every label is escaped here, because the result is inserted
//! into the page as trusted markup; long labels end in an ellipsis. The SVG
//! scales through its `viewBox`; its colours come from the page stylesheet,
//! so it follows light and dark mode.

use std::collections::HashMap;
use std::fmt::Write as _;

use zopu_schema::pb::{DiagramEdge, DiagramNode};

/// Boxes per row; two keeps labels legible when a phone scales the diagram.
pub const COLUMNS_MAX: usize = 2;
const BOX_WIDTH: i32 = 216;
const BOX_HEIGHT: i32 = 60;
const GAP_X: i32 = 36;
const GAP_Y: i32 = 52;
const PAD: i32 = 14;
const BACK_EDGE_LANE: i32 = 36;
const LABEL_CHARS_MAX: usize = 24;
const DETAIL_CHARS_MAX: usize = 32;
const EDGE_LABEL_CHARS_MAX: usize = 22;

/// Renders the diagram as an `<svg>` element. `title` becomes its accessible
/// name. Edges naming unknown nodes and self-loops are skipped (manifest
/// validation rejects the former).
pub fn svg(nodes: &[DiagramNode], edges: &[DiagramEdge], title: &str) -> String {
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let links: Vec<(usize, usize, &str)> = edges
        .iter()
        .filter_map(|e| {
            let from = *index.get(e.from.as_str())?;
            let to = *index.get(e.to.as_str())?;
            (from != to).then_some((from, to, e.label.as_str()))
        })
        .collect();

    let layers = layers(nodes.len(), &links);
    // Rows: each layer in node order, wrapped at COLUMNS_MAX.
    let layer_count = layers.iter().copied().max().map_or(0, |m| m + 1);
    let mut rows: Vec<Vec<usize>> = Vec::new();
    for layer in 0..layer_count {
        let members: Vec<usize> = (0..nodes.len()).filter(|&n| layers[n] == layer).collect();
        rows.extend(members.chunks(COLUMNS_MAX).map(<[usize]>::to_vec));
    }
    let columns = rows.iter().map(Vec::len).max().unwrap_or(1).max(1) as i32;
    let mut row_of = vec![0usize; nodes.len()];
    for (r, row) in rows.iter().enumerate() {
        for &n in row {
            row_of[n] = r;
        }
    }
    // Edges that go up or skip a row use a lane on the right.
    let has_back_edge = links
        .iter()
        .any(|&(f, t, _)| row_of[t] != row_of[f] && row_of[t] != row_of[f] + 1);
    let content_width = columns * BOX_WIDTH + (columns - 1) * GAP_X;
    let lane = if has_back_edge { BACK_EDGE_LANE } else { 0 };
    let width = content_width + 2 * PAD + lane;
    let height = rows.len() as i32 * (BOX_HEIGHT + GAP_Y) - GAP_Y + 2 * PAD;

    // Box origin of every node.
    let mut origin = vec![(0, 0); nodes.len()];
    for (r, row) in rows.iter().enumerate() {
        let used = row.len() as i32 * BOX_WIDTH + (row.len() as i32 - 1) * GAP_X;
        let x0 = PAD + (content_width - used) / 2;
        let y = PAD + r as i32 * (BOX_HEIGHT + GAP_Y);
        for (c, &n) in row.iter().enumerate() {
            origin[n] = (x0 + c as i32 * (BOX_WIDTH + GAP_X), y);
        }
    }

    let mut out = String::with_capacity(512 + nodes.len() * 420 + links.len() * 260);
    // Writing to a String cannot fail; the results are ignored on purpose.
    let _ = write!(
        out,
        r#"<svg class="diagram" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{label}" xmlns="http://www.w3.org/2000/svg"><title>{label}</title>"#,
        label = escape(title),
    );
    out.push_str(r#"<g class="edges">"#);
    for &(from, to, label) in &links {
        edge(
            &mut out,
            origin[from],
            origin[to],
            row_of[from],
            row_of[to],
            content_width,
            label,
        );
    }
    out.push_str("</g><g class=\"nodes\">");
    for (n, node) in nodes.iter().enumerate() {
        let (x, y) = origin[n];
        let _ = write!(
            out,
            r#"<g class="node"><title>{full}</title><rect x="{x}" y="{y}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="10"/>"#,
            full = escape(&node.label),
        );
        let cx = x + BOX_WIDTH / 2;
        if node.detail.trim().is_empty() {
            let _ = write!(
                out,
                r#"<text class="node-label" x="{cx}" y="{}" text-anchor="middle">{}</text>"#,
                y + BOX_HEIGHT / 2 + 5,
                escape(&truncate(&node.label, LABEL_CHARS_MAX)),
            );
        } else {
            let _ = write!(
                out,
                r#"<text class="node-label" x="{cx}" y="{}" text-anchor="middle">{}</text><text class="node-detail" x="{cx}" y="{}" text-anchor="middle">{}</text>"#,
                y + 26,
                escape(&truncate(&node.label, LABEL_CHARS_MAX)),
                y + 45,
                escape(&truncate(first_line(&node.detail), DETAIL_CHARS_MAX)),
            );
        }
        out.push_str("</g>");
    }
    out.push_str("</g></svg>");
    out
}

/// Longest-path layer of every node, ignoring DFS back edges.
fn layers(count: usize, links: &[(usize, usize, &str)]) -> Vec<usize> {
    let mut out_edges = vec![Vec::new(); count];
    for &(f, t, _) in links {
        out_edges[f].push(t);
    }
    // Iterative DFS marking back edges (0 = new, 1 = on stack, 2 = done).
    let mut state = vec![0u8; count];
    let mut forward = vec![Vec::new(); count];
    for start in 0..count {
        if state[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        state[start] = 1;
        while let Some(top) = stack.last_mut() {
            let node = top.0;
            if let Some(&target) = out_edges[node].get(top.1) {
                top.1 += 1;
                match state[target] {
                    0 => {
                        forward[node].push(target);
                        state[target] = 1;
                        stack.push((target, 0));
                    }
                    2 => forward[node].push(target),
                    _ => {} // back edge: on the stack
                }
            } else {
                state[node] = 2;
                stack.pop();
            }
        }
    }
    // Kahn's algorithm over forward edges, lowest index first.
    let mut indegree = vec![0usize; count];
    for targets in &forward {
        for &t in targets {
            indegree[t] += 1;
        }
    }
    let mut layer = vec![0usize; count];
    let mut ready: std::collections::BTreeSet<usize> =
        (0..count).filter(|&n| indegree[n] == 0).collect();
    while let Some(node) = ready.pop_first() {
        for &t in &forward[node] {
            layer[t] = layer[t].max(layer[node] + 1);
            indegree[t] -= 1;
            if indegree[t] == 0 {
                ready.insert(t);
            }
        }
    }
    layer
}

fn edge(
    out: &mut String,
    from: (i32, i32),
    to: (i32, i32),
    from_row: usize,
    to_row: usize,
    content_width: i32,
    label: &str,
) {
    let (path, tip, tangent, mid) = if to_row == from_row + 1 {
        // Downwards: bottom centre to top centre, an S-curve.
        let (sx, sy) = (from.0 + BOX_WIDTH / 2, from.1 + BOX_HEIGHT);
        let (tx, ty) = (to.0 + BOX_WIDTH / 2, to.1 - 2);
        let bend = (ty - sy) / 2;
        (
            format!(
                "M{sx},{sy} C{sx},{} {tx},{} {tx},{ty}",
                sy + bend,
                ty - bend
            ),
            (tx, ty),
            (0.0, 1.0),
            ((sx + tx) / 2, (sy + ty) / 2),
        )
    } else if to_row == from_row {
        // Same row: side to side.
        let left_to_right = to.0 > from.0;
        let sy = from.1 + BOX_HEIGHT / 2;
        let (sx, tx, dir) = if left_to_right {
            (from.0 + BOX_WIDTH, to.0 - 2, 1.0)
        } else {
            (from.0, to.0 + BOX_WIDTH + 2, -1.0)
        };
        (
            format!("M{sx},{sy} L{tx},{sy}"),
            (tx, sy),
            (dir, 0.0),
            ((sx + tx) / 2, sy - 8),
        )
    } else {
        // Upwards (a cycle) or skipping rows: out through the right-hand
        // lane and back in, so the curve does not cross the boxes between.
        let lane_x = PAD + content_width + BACK_EDGE_LANE - 8;
        let (sx, sy) = (from.0 + BOX_WIDTH, from.1 + BOX_HEIGHT / 2);
        let (tx, ty) = (to.0 + BOX_WIDTH + 2, to.1 + BOX_HEIGHT / 2);
        (
            format!("M{sx},{sy} C{lane_x},{sy} {lane_x},{ty} {tx},{ty}"),
            (tx, ty),
            (-1.0, 0.0),
            (lane_x - 10, (sy + ty) / 2),
        )
    };
    let _ = write!(out, r#"<path class="edge" d="{path}"/>"#);
    // Arrowhead: a small triangle with its tip on the target box.
    let (ux, uy): (f64, f64) = tangent;
    let (tipx, tipy) = (f64::from(tip.0), f64::from(tip.1));
    let (bx, by) = (tipx - ux * 9.0, tipy - uy * 9.0);
    let (px, py) = (-uy * 4.5, ux * 4.5);
    let _ = write!(
        out,
        r#"<path class="arrow" d="M{tipx:.1},{tipy:.1} L{:.1},{:.1} L{:.1},{:.1} Z"/>"#,
        bx + px,
        by + py,
        bx - px,
        by - py,
    );
    if !label.trim().is_empty() {
        let _ = write!(
            out,
            r#"<text class="edge-label" x="{}" y="{}" text-anchor="middle">{}</text>"#,
            mid.0,
            mid.1 + 4,
            escape(&truncate(label, EDGE_LABEL_CHARS_MAX)),
        );
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// At most `max` characters, the last one an ellipsis when cut.
pub fn truncate(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.truncate(out.trim_end().len());
    out.push('…');
    out
}

/// Escapes text for HTML/SVG text and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, label: &str) -> DiagramNode {
        DiagramNode {
            id: id.into(),
            label: label.into(),
            detail: String::new(),
        }
    }

    fn edge(from: &str, to: &str) -> DiagramEdge {
        DiagramEdge {
            from: from.into(),
            to: to.into(),
            label: String::new(),
        }
    }

    #[test]
    fn chain_gets_one_layer_per_node() {
        let links = [(0, 1, ""), (1, 2, "")];
        assert_eq!(layers(3, &links), vec![0, 1, 2]);
    }

    #[test]
    fn cycles_terminate_and_still_layer() {
        let links = [(0, 1, ""), (1, 2, ""), (2, 0, "")];
        assert_eq!(layers(3, &links), vec![0, 1, 2]);
    }

    #[test]
    fn labels_are_escaped_and_truncated() {
        let nodes = [node(
            "a",
            "<script>alert(1)</script> and a very long label indeed",
        )];
        let svg = svg(&nodes, &[], "t\"itle");
        assert!(!svg.contains("<script"));
        assert!(
            svg.contains(">&lt;script&gt;alert(1)&lt;/scrip…</text>"),
            "{svg}"
        );
        assert!(svg.contains("aria-label=\"t&quot;itle\""));
    }

    #[test]
    fn output_is_deterministic() {
        let nodes = [node("a", "A"), node("b", "B"), node("c", "C")];
        let edges = [edge("a", "b"), edge("a", "c"), edge("c", "a")];
        assert_eq!(svg(&nodes, &edges, "x"), svg(&nodes, &edges, "x"));
    }
}
