//! Questions about running, building or testing the project, answered
//! from the commands onboarding found (summary.md's commands section, the
//! same the setup artifact shows).

/// The heading of summary.md's commands section (the onboarding flow writes it).
const COMMANDS_HEADING: &str = "## Likely run/build/test commands";
/// Commands quoted in one answer at most.
const COMMANDS_QUOTED_MAX: usize = 3;

/// The answer to a run/build/test question from summary.md's commands
/// (each `` - `command` — purpose — **verified**|*inferred* — source ``):
/// those for what was asked first, verified before inferred; `None` when
/// onboarding found none.
pub(super) fn commands_answer(words: &[String], summary: &str) -> Option<String> {
    let section = summary.split(COMMANDS_HEADING).nth(1)?;
    let commands: Vec<(&str, &str, bool, &str)> = section
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut parts = line.strip_prefix("- `")?.splitn(4, " — ");
            let command = parts.next()?.strip_suffix('`')?;
            let purpose = parts.next()?;
            let verified = parts.next()?.contains("verified");
            Some((command, purpose, verified, parts.next().unwrap_or_default()))
        })
        .collect();
    if commands.is_empty() {
        return None;
    }
    let asked: Vec<&str> = ["test", "build", "run", "lint", "install", "start"]
        .into_iter()
        .filter(|topic| words.iter().any(|word| word.starts_with(topic)))
        .collect();
    let mut ordered = commands;
    ordered.sort_by_key(|(_, purpose, verified, _)| {
        let about = asked.iter().any(|topic| purpose.contains(topic));
        (!about, !verified)
    });
    let quoted: Vec<String> = ordered
        .into_iter()
        .take(COMMANDS_QUOTED_MAX)
        .map(|(command, purpose, verified, source)| {
            let how = if verified { "verified" } else { "inferred" };
            format!("`{command}` ({purpose}; {how}: {source})")
        })
        .collect();
    Some(format!(
        "From what onboarding found: {}. Say \"run the tests\" and I'll run the test command in a sandboxed copy.",
        quoted.join("; ")
    ))
}
