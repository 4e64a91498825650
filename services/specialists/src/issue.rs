//! Issue definition (main spec section 31) with the offline provider: reuse
//! the project's latest exploration when it is about the same thing, gather
//! repository evidence, and write an implementation-ready issue whose
//! current world cites only verified code. Publishing to a tracker is a
//! separate, later action.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;
use zopu_runtime::text::clip_chars;

use zopu_schema::pb::FlowPhase;

use zopu_answerer::explore::{self, Gathered};
use zopu_answerer::grounding;
use zopu_answerer::port::{FlowError, Port};
use zopu_answerer::results::{
    EvidenceItem, ExplorationResult, IssueResult, Provenance, ResultVersion,
};

/// Files cited by an offline issue.
const TOP_FILES: usize = 4;

/// What issue definition starts from.
#[derive(Debug, Clone, Default)]
pub struct IssueInput {
    pub request: String,
    pub provider: String,
    pub repository_commit: String,
    /// The project's latest exploration (flow run id, result), if any.
    pub exploration: Option<(String, ExplorationResult)>,
    /// The test command from the project's summary, if known.
    pub test_command: Option<String>,
    /// The user's stated preferences the conversation agent shared
    /// (`flow.requested`'s `preferences`), e.g. "Skip tests in issue drafts".
    pub preferences: Vec<String>,
}

/// Phrases of a preference that keeps tests out of issue drafts.
const SKIP_TESTS: &[&str] = &[
    "skip tests",
    "no tests",
    "without tests",
    "omit tests",
    "leave out tests",
    "leave tests out",
    "exclude tests",
];

/// Whether the user asked for issue drafts without tests.
pub fn skips_tests(preferences: &[String]) -> bool {
    preferences.iter().any(|preference| {
        let preference = preference.to_lowercase();
        SKIP_TESTS.iter().any(|phrase| preference.contains(phrase))
    })
}

/// A request's wrapper: politeness ("please", "could you"), then "write/
/// create/file… an issue (to/for/about/:)", either alone; what follows is
/// the issue's subject.
static REQUEST_WRAPPER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^\s*
        (?:(?:please|pls|hey|ok|okay)[,\s]+)*
        (?:(?:can|could|would|will)\s+you\s+(?:please\s+)?)?
        (?:(?:create|make|file|open|write|draft|raise|add|log|prepare|submit)\s+
           (?:me\s+)?(?:an?\s+|the\s+|one\s+)?(?:new\s+)?(?:github\s+|tracker\s+)?
           (?:issue|ticket|bug\s+report|bug|task|story)s?
           (?:\s+(?:to|for|about|that|on|regarding|describing))?
           \s*[:\-–—]?\s*
        |(?:issue|ticket|task)\s*[:\-–—]\s*)?",
    )
    .expect("the wrapper pattern compiles")
});

/// The request's intent as a title: without its "write an issue" wrapper,
/// said as the change to make or the problem as it stands ([`intent_of`]).
pub fn title_of(request: &str) -> String {
    let trimmed = request.trim().trim_end_matches(['.', '!', '?']);
    let subject = REQUEST_WRAPPER
        .find(trimmed)
        .map_or(trimmed, |wrapper| &trimmed[wrapper.end()..]);
    let subject = subject
        .trim()
        .trim_start_matches(['"', '\''])
        .trim_end_matches(['"', '\'']);
    let subject = intent_of(subject);
    let mut chars = subject.chars();
    let title: String = match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => "Untitled issue".to_owned(),
    };
    clip_chars(&title, 100)
}

/// Verbs a change is asked with: (base, gerund).
const CHANGE_VERBS: &[(&str, &str)] = &[
    ("add", "adding"),
    ("create", "creating"),
    ("introduce", "introducing"),
    ("implement", "implementing"),
    ("build", "building"),
    ("provide", "providing"),
    ("support", "supporting"),
    ("enable", "enabling"),
    ("allow", "allowing"),
    ("fix", "fixing"),
    ("resolve", "resolving"),
    ("remove", "removing"),
    ("delete", "deleting"),
    ("drop", "dropping"),
    ("deprecate", "deprecating"),
    ("improve", "improving"),
    ("optimize", "optimizing"),
    ("document", "documenting"),
    ("update", "updating"),
    ("upgrade", "upgrading"),
    ("rename", "renaming"),
    ("refactor", "refactoring"),
    ("simplify", "simplifying"),
    ("test", "testing"),
    ("make", "making"),
    ("show", "showing"),
    ("use", "using"),
    ("move", "moving"),
    ("replace", "replacing"),
];

/// How a request states a want rather than the change ("we need to ...",
/// "it would be nice to ...", "there is no way to ...").
static WANT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^
        (?:(?:we|i|you|they|users?|people)\s+(?:really\s+)?
           (?:need|want|would\s+like|'d\s+like|should|must|have)\s+(?:to\s+)?(?:be\s+able\s+to\s+)?
        |it\s+would\s+be\s+(?:nice|great|good|useful|helpful)\s+to\s+(?:be\s+able\s+to\s+)?
        |(?P<none>there\s+is\s+no|there's\s+no|there\s+are\s+no)\s+)",
    )
    .expect("the want pattern compiles")
});

/// Nouns with no "a" before them, after "there is no".
const UNCOUNTED: &[&str] = &[
    "support",
    "feedback",
    "information",
    "progress",
    "help",
    "coverage",
    "documentation",
    "access",
];

/// A request's subject said as its intent:
/// - a want as the change: "we need to remove X" is "remove X", "we need
///   dark mode" is "add dark mode", "there is no way to X" is "add a way to X";
/// - a change in the gerund as an imperative: "adding X" is "add X";
/// - a problem in the gerund as it stands: "the login page crashing" is
///   "the login page crashes".
///
/// Anything else is kept as written.
fn intent_of(subject: &str) -> String {
    let subject = subject.trim();
    if let Some(want) = WANT.captures(subject) {
        let rest = subject[want.get(0).map_or(0, |m| m.end())..].trim();
        if rest.is_empty() {
            return subject.to_owned();
        }
        let first = rest
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_lowercase();
        // After "to" comes a verb ("we need to pin ..."); else a noun ("we need dark mode").
        let verb_follows = want
            .get(0)
            .is_some_and(|m| m.as_str().trim_end().to_lowercase().ends_with(" to"));
        return match want.name("none") {
            None if verb_follows || CHANGE_VERBS.iter().any(|(base, _)| *base == first) => {
                rest.to_owned()
            }
            // "There is no timeout": add a timeout (not "a support").
            Some(none)
                if !none.as_str().to_lowercase().contains("are")
                    && !first.ends_with("ing")
                    && !first.ends_with("tion")
                    && !UNCOUNTED.contains(&first.as_str()) =>
            {
                format!("add a {rest}")
            }
            _ => format!("add {rest}"),
        };
    }
    let (first, rest) = subject.split_once(' ').unwrap_or((subject, ""));
    if let Some((base, _)) = CHANGE_VERBS
        .iter()
        .find(|(_, gerund)| first.eq_ignore_ascii_case(gerund))
        && !rest.is_empty()
    {
        return format!("{base} {rest}");
    }
    problem_as_it_stands(subject).unwrap_or_else(|| subject.to_owned())
}

/// "The login page crashing when ..." as "The login page crashes when ...".
fn problem_as_it_stands(subject: &str) -> Option<String> {
    let words: Vec<&str> = subject.split_whitespace().collect();
    let (at, (base, third, _)) = words.iter().enumerate().skip(1).find_map(|(at, word)| {
        PROBLEM_VERBS
            .iter()
            .find(|(_, _, gerund)| word.eq_ignore_ascii_case(gerund))
            .map(|verb| (at, verb))
    })?;
    let mut stated: Vec<&str> = words.clone();
    stated[at] = agreeing((base, third), words[at - 1]);
    Some(stated.join(" "))
}

/// A problem verb in the form that agrees with the word before it: "tests
/// fail", "the page crashes".
fn agreeing((base, third): (&'static str, &'static str), before: &str) -> &'static str {
    if before.ends_with('s') && !before.ends_with("ss") {
        base
    } else {
        third
    }
}

/// What the world looks like once the titled change is made, from the
/// title's intent (its leading verb, or the problem it states) rather than
/// its wording: "Add a revoke command" becomes "a revoke command exists",
/// "The login page crashing" becomes "the login page no longer crashes".
pub fn desired_world_of(title: &str) -> String {
    let (verb, rest) = title.split_once(' ').unwrap_or((title, ""));
    let object = rest.trim();
    let outcome = match verb.to_lowercase().as_str() {
        _ if object.is_empty() => None,
        "add" | "create" | "introduce" | "implement" | "build" | "provide" => {
            Some(format!("{object} exists and is part of the product"))
        }
        "support" | "enable" => Some(format!("{object} is supported")),
        "allow" | "let" => Some(format!("the product allows {object}")),
        "fix" | "repair" | "resolve" | "correct" => Some(format!("{object} is fixed")),
        "remove" | "delete" | "drop" | "deprecate" => Some(format!("{object} is gone")),
        "improve" | "optimize" | "optimise" | "speed" => {
            Some(format!("{object} is measurably better than today"))
        }
        "document" => Some(format!("{object} is documented")),
        "update" | "upgrade" | "bump" => Some(format!("{object} is up to date")),
        "rename" => Some(format!("the rename is done: {object}")),
        "refactor" | "simplify" | "clean" => {
            Some(format!("{object} is simpler, with its behaviour unchanged"))
        }
        "test" => Some(format!("{object} is covered by automated tests")),
        _ => None,
    };
    match outcome.or_else(|| problem_gone(title)) {
        Some(outcome) => format!("After this change, {outcome}."),
        None => format!("After this change: {}.", lower_first(title)),
    }
}

/// Verbs that report a problem: (base, third person, gerund).
const PROBLEM_VERBS: &[(&str, &str, &str)] = &[
    ("crash", "crashes", "crashing"),
    ("fail", "fails", "failing"),
    ("hang", "hangs", "hanging"),
    ("freeze", "freezes", "freezing"),
    ("leak", "leaks", "leaking"),
    ("break", "breaks", "breaking"),
    ("panic", "panics", "panicking"),
    ("error", "errors", "erroring"),
    ("flake", "flakes", "flaking"),
];

/// States that report a problem after "is" or "are".
const PROBLEM_STATES: &[&str] = &[
    "slow",
    "broken",
    "flaky",
    "wrong",
    "missing",
    "unresponsive",
    "stuck",
    "failing",
];

/// A title that states a problem ("The login page crashing", "Search is
/// slow for large projects") as the world without it ("the login page no
/// longer crashes", "search is no longer slow for large projects").
fn problem_gone(title: &str) -> Option<String> {
    let words: Vec<&str> = title.split_whitespace().collect();
    // The words of `title` from `from` on, each after a space.
    let rest = |from: usize| -> String { words[from..].iter().map(|w| format!(" {w}")).collect() };
    for (at, word) in words.iter().enumerate().skip(1) {
        let lower = word.to_lowercase();
        let subject = || lower_first(&words[..at].join(" "));
        if let Some((base, third, _)) = PROBLEM_VERBS
            .iter()
            .find(|(base, third, gerund)| [*base, *third, *gerund].contains(&lower.as_str()))
        {
            let verb = agreeing((base, third), words[at - 1]);
            return Some(format!("{} no longer {verb}{}", subject(), rest(at + 1)));
        }
        if matches!(lower.as_str(), "is" | "are")
            && let Some(state) = words.get(at + 1)
            && PROBLEM_STATES.contains(&state.to_lowercase().as_str())
        {
            return Some(format!(
                "{} {lower} no longer {state}{}",
                subject(),
                rest(at + 2)
            ));
        }
    }
    None
}

fn lower_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn relevant(exploration: &ExplorationResult, keywords: &[String]) -> bool {
    let own: BTreeSet<String> = exploration
        .keywords
        .iter()
        .map(|k| k.to_lowercase())
        .collect();
    keywords.iter().any(|k| own.contains(&k.to_lowercase()))
}

/// What the change leaves alone: work beyond the files it was scoped to,
/// and tests when the user asked to leave them out. Only what bounds this
/// change; nothing about the draft itself (where it gets published is the
/// runtime's business, not the issue's).
fn non_goals_of(paths: &[String], with_tests: bool) -> Vec<String> {
    let mut non_goals = vec![if paths.is_empty() {
        "Refactoring existing code beyond what the new capability needs".to_owned()
    } else {
        let named: Vec<String> = paths.iter().take(4).map(|p| format!("`{p}`")).collect();
        format!(
            "Refactoring {} beyond what the change needs",
            named.join(", ")
        )
    }];
    if !with_tests {
        non_goals.push("Tests: the user asked to leave them out of issue drafts".to_owned());
    }
    non_goals
}

/// Offline issue definition through `port`.
pub async fn define<P: Port>(port: &mut P, input: &IssueInput) -> Result<IssueResult, FlowError> {
    port.phase(FlowPhase::Plan, 1, "Understanding the request")
        .await?;
    let keywords = explore::keywords(&input.request);
    let reused = input
        .exploration
        .as_ref()
        .filter(|(_, exploration)| relevant(exploration, &keywords) || keywords.is_empty());
    port.phase(FlowPhase::Act, 1, "Gathering repository evidence")
        .await?;
    let gathered: Gathered =
        explore::gather(port, "issue:1", &input.request, &keywords, TOP_FILES).await?;
    let mut evidence: Vec<EvidenceItem> = explore::findings(&gathered, TOP_FILES)
        .into_iter()
        .flat_map(|f| f.evidence.into_iter().take(2))
        .collect();
    if let Some((_, exploration)) = reused {
        for finding in &exploration.findings {
            for item in finding.evidence.iter().filter(|e| e.verified).take(2) {
                if !evidence
                    .iter()
                    .any(|e| e.path == item.path && e.start_line == item.start_line)
                {
                    evidence.push(item.clone());
                }
            }
        }
    }
    evidence.truncate(12);
    port.phase(
        FlowPhase::Reflect,
        1,
        "Reviewing the issue against the evidence",
    )
    .await?;
    let grounded = grounding::verify(port, "verify", evidence).await?;
    let evidence: Vec<EvidenceItem> = grounded.kept;
    let verified: Vec<&EvidenceItem> = evidence.iter().filter(|e| e.verified).collect();
    let title = title_of(&input.request);
    let mut paths: Vec<String> = Vec::new();
    for item in &verified {
        if !paths.contains(&item.path) {
            paths.push(item.path.clone());
        }
    }
    let current_world = if verified.is_empty() {
        format!(
            "No code in the repository mentions {}: the capability appears not to exist yet (assumption from keyword search).",
            keywords
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        let cited: Vec<String> = verified
            .iter()
            .take(4)
            .map(|e| {
                format!(
                    "`{}` line {} (`{}`)",
                    e.path,
                    e.start_line,
                    clip_chars(&e.snippet, 80).replace('`', "'")
                )
            })
            .collect();
        let mut text = format!("The relevant code today lives in {}.", cited.join("; "));
        if let Some((_, exploration)) = reused {
            text.push_str(&format!(
                " An earlier exploration found: {}",
                clip_chars(&exploration.summary, 400)
            ));
        }
        text
    };
    let desired_world = desired_world_of(&title);
    let mut scope: Vec<String> = paths
        .iter()
        .take(4)
        .map(|p| format!("Changes in `{p}` and the code it calls"))
        .collect();
    let with_tests = !skips_tests(&input.preferences);
    if with_tests {
        scope.push("Tests covering the new or changed behaviour".to_owned());
    }
    let non_goals = non_goals_of(&paths, with_tests);
    let test = input.test_command.clone().map_or_else(
        || "the project's test suite".to_owned(),
        |c| format!("`{c}`"),
    );
    let mut acceptance_criteria = vec![format!("{} works as described in the request", title)];
    if with_tests {
        acceptance_criteria.push(format!(
            "Automated tests cover the new behaviour and {test} passes"
        ));
    }
    acceptance_criteria.push("Existing behaviour outside the scope is unchanged".to_owned());
    acceptance_criteria.push("User-visible changes are documented".to_owned());
    let mut risks = vec!["Heuristic: the affected code was located by keyword search; confirm the scope before implementing.".to_owned()];
    if paths.len() > 2 {
        risks.push(format!(
            "The change touches {} files; coordinate if others are working there.",
            paths.len()
        ));
    }
    let mut open_questions: Vec<String> = gathered
        .unmatched
        .iter()
        .map(|k| format!("Where should `{k}` live? Nothing in the repository mentions it yet."))
        .collect();
    open_questions.push("Which edge cases and failure modes must be handled?".to_owned());
    let mut shape: Vec<String> = verified
        .iter()
        .take(3)
        .map(|e| format!("Start in `{}` near line {}", e.path, e.start_line))
        .collect();
    if with_tests {
        shape.push("Add or extend tests next to the existing ones".to_owned());
    }
    let summary = format!(
        "{title}. Grounded in {} verified repository location(s){}.",
        verified.len(),
        reused
            .map(|(id, _)| format!(", reusing exploration run {id}"))
            .unwrap_or_default()
    );
    Ok(IssueResult {
        version: ResultVersion::CURRENT,
        title,
        summary,
        current_world,
        desired_world,
        scope,
        non_goals,
        acceptance_criteria,
        evidence,
        risks,
        open_questions,
        suggested_implementation_shape: shape,
        based_on_flow_run: reused.map(|(id, _)| id.clone()).unwrap_or_default(),
        provenance: Provenance {
            provider: input.provider.clone(),
            heuristic: true,
            repository_commit: input.repository_commit.clone(),
            ..Default::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_goals_bound_the_change_and_say_nothing_about_publishing() {
        let paths = vec!["src/auth.rs".to_owned(), "src/login.rs".to_owned()];
        assert_eq!(
            non_goals_of(&paths, true),
            ["Refactoring `src/auth.rs`, `src/login.rs` beyond what the change needs"]
        );
        let without_tests = non_goals_of(&[], false);
        assert_eq!(without_tests.len(), 2, "{without_tests:?}");
        assert!(without_tests[1].starts_with("Tests: "));
        for goal in non_goals_of(&paths, false) {
            assert!(!goal.to_lowercase().contains("tracker"), "{goal}");
            assert!(!goal.to_lowercase().contains("publish"), "{goal}");
        }
    }

    #[test]
    fn a_preference_to_skip_tests_is_recognized() {
        assert!(skips_tests(&["Skip tests in issue drafts".to_owned()]));
        assert!(skips_tests(&[
            "Answer in German".to_owned(),
            "Please write issues WITHOUT TESTS".to_owned()
        ]));
        assert!(!skips_tests(&["Answer in German".to_owned()]));
        assert!(!skips_tests(&[]));
    }

    #[test]
    fn titles_drop_the_request_wrapper() {
        assert_eq!(
            title_of("Create an issue to add rate limiting to the login endpoint."),
            "Add rate limiting to the login endpoint"
        );
        assert_eq!(title_of(""), "Untitled issue");
        for (request, title) in [
            (
                "Write an issue: add a zopu token revoke command",
                "Add a zopu token revoke command",
            ),
            (
                "Please write an issue for supporting private registries.",
                "Support private registries",
            ),
            (
                "Could you file a bug report about the login page crashing?",
                "The login page crashes",
            ),
            (
                "Write an issue: the nightly tests failing on main",
                "The nightly tests fail on main",
            ),
            (
                "Write an issue: we need to remove the legacy exporter",
                "Remove the legacy exporter",
            ),
            (
                "Open a ticket: we need dark mode on the dashboard",
                "Add dark mode on the dashboard",
            ),
            (
                "File an issue: there is no way to revoke a token",
                "Add a way to revoke a token",
            ),
            (
                "Write an issue: there is no support for private registries",
                "Add support for private registries",
            ),
            (
                "Write an issue: there are no tests for the importer",
                "Add tests for the importer",
            ),
            (
                "Write an issue: it would be nice to be able to pin artifacts",
                "Pin artifacts",
            ),
            (
                "Write an issue about adding a zopu token revoke command",
                "Add a zopu token revoke command",
            ),
            // Politeness alone is a wrapper too.
            (
                "Please fix the flaky snapshot tests in the gateway",
                "Fix the flaky snapshot tests in the gateway",
            ),
            (
                "Could you please add retries to the webhook sender?",
                "Add retries to the webhook sender",
            ),
            ("Please", "Please"),
            // Neither a want, a gerund nor a problem: as written.
            (
                "Write an issue: dark mode for the dashboard",
                "Dark mode for the dashboard",
            ),
            (
                "Write an issue: string handling in the parser",
                "String handling in the parser",
            ),
            (
                "Issue - remove the legacy importer",
                "Remove the legacy importer",
            ),
            (
                "Add dark mode to the dashboard",
                "Add dark mode to the dashboard",
            ),
            ("Create issue: \"fix the flaky test\"", "Fix the flaky test"),
        ] {
            assert_eq!(title_of(request), title, "{request}");
        }
    }

    #[test]
    fn the_desired_world_says_what_is_true_after_the_change() {
        assert_eq!(
            desired_world_of("Add a zopu token revoke command"),
            "After this change, a zopu token revoke command exists and is part of the product."
        );
        assert_eq!(
            desired_world_of("Fix the flaky login test"),
            "After this change, the flaky login test is fixed."
        );
        // A stated problem: the world without it.
        for (title, world) in [
            (
                "The login page crashing",
                "After this change, the login page no longer crashes.",
            ),
            (
                "Login fails with a 500 on Safari",
                "After this change, login no longer fails with a 500 on Safari.",
            ),
            (
                "Nightly tests failing on main",
                "After this change, nightly tests no longer fail on main.",
            ),
            (
                "Search is slow for large projects",
                "After this change, search is no longer slow for large projects.",
            ),
        ] {
            assert_eq!(desired_world_of(title), world, "{title}");
        }
        // Titles said from the request's intent lead to their worlds.
        for (request, world) in [
            (
                "Write an issue: there is no way to revoke a token",
                "After this change, a way to revoke a token exists and is part of the product.",
            ),
            (
                "File a bug: the nightly tests failing on main",
                "After this change, the nightly tests no longer fail on main.",
            ),
            (
                "Write an issue about removing the legacy exporter",
                "After this change, the legacy exporter is gone.",
            ),
        ] {
            assert_eq!(desired_world_of(&title_of(request)), world, "{request}");
        }
        // Neither an action nor a problem: said as it is.
        assert_eq!(
            desired_world_of("Dark mode for the dashboard"),
            "After this change: dark mode for the dashboard."
        );
    }
}
