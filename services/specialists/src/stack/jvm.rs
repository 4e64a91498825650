//! JVM builds: Maven's `pom.xml` and Gradle build scripts (the project's
//! own coordinates, frameworks and plugins, and the build's commands).

use std::sync::LazyLock;

use regex::Regex;

use super::{GRADLE_PLUGINS, JVM_FRAMEWORKS, ManifestFacts, hint, in_dir, named_in};
use zopu_answerer::results::{CommandStatus, StackItem};

/// The blocks of a `pom.xml` whose tags are not the project's own.
pub(super) static OTHER_POM_BLOCKS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        "parent",
        "dependencies",
        "dependencyManagement",
        "build",
        "profiles",
        "reporting",
        "modules",
    ]
    .iter()
    .filter_map(|tag| Regex::new(&format!(r"(?s)<{tag}>.*?</{tag}>")).ok())
    .collect()
});

pub(super) static XML_TAG: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"<(artifactId|description|java\.version|maven\.compiler\.source)>([^<]{1,200})</")
        .ok()
});

pub(super) fn maven(path: &str, dir: &str, content: &str) -> ManifestFacts {
    let mut facts = ManifestFacts {
        stack: Some(StackItem {
            language: "Java/JVM".into(),
            tool: "Maven".into(),
            manifest: path.into(),
            frameworks: vec![],
            packages: 1,
        }),
        ..Default::default()
    };
    // The project's own tags: those of its parent, dependencies and build
    // plugins are cut out first.
    let own = OTHER_POM_BLOCKS
        .iter()
        .fold(content.to_owned(), |text, block| {
            block.replace_all(&text, "").into_owned()
        });
    let artifact = |text: &str, id: &str| text.contains(&format!("<artifactId>{id}"));
    if let Some(stack) = facts.stack.as_mut() {
        stack.frameworks = named_in(content, JVM_FRAMEWORKS, &artifact);
    }
    if let Some(re) = XML_TAG.as_ref() {
        for captures in re.captures_iter(&own) {
            match &captures[1] {
                "artifactId" if facts.name.is_none() => {
                    facts.name = Some(captures[2].trim().to_owned())
                }
                "description" if facts.description.is_none() => {
                    facts.description = Some(captures[2].trim().to_owned())
                }
                "java.version" | "maven.compiler.source" => facts
                    .constraints
                    .push(format!("Java {} ({path})", captures[2].trim())),
                _ => {}
            }
        }
    }
    let convention = "Maven convention; not run";
    facts.commands.push(hint(
        "build",
        in_dir(dir, "mvn package"),
        CommandStatus::Inferred,
        convention,
    ));
    facts.commands.push(hint(
        "test",
        in_dir(dir, "mvn test"),
        CommandStatus::Inferred,
        convention,
    ));
    facts
}

pub(super) fn gradle(
    path: &str,
    dir: &str,
    content: &str,
    has: &dyn Fn(&str) -> bool,
) -> ManifestFacts {
    // A dependency is named `group:artifact:version`.
    let artifact = |text: &str, id: &str| text.contains(&format!(":{id}"));
    let gradle = if has("gradlew") {
        "./gradlew"
    } else {
        "gradle"
    };
    let convention = format!(
        "Gradle convention{}; not run",
        if has("gradlew") {
            " (gradlew present)"
        } else {
            ""
        }
    );
    ManifestFacts {
        stack: Some(StackItem {
            language: "Java/JVM".into(),
            tool: "Gradle".into(),
            manifest: path.into(),
            frameworks: {
                let mut frameworks = named_in(content, JVM_FRAMEWORKS, &artifact);
                let plugin = |text: &str, id: &str| {
                    text.contains(&format!("id '{id}'")) || text.contains(&format!("id \"{id}\""))
                };
                for name in named_in(content, GRADLE_PLUGINS, &plugin) {
                    if !frameworks.contains(&name) {
                        frameworks.push(name);
                    }
                }
                frameworks
            },
            packages: 1,
        }),
        commands: vec![
            hint(
                "build",
                in_dir(dir, &format!("{gradle} build")),
                CommandStatus::Inferred,
                convention.clone(),
            ),
            hint(
                "test",
                in_dir(dir, &format!("{gradle} test")),
                CommandStatus::Inferred,
                convention,
            ),
        ],
        ..Default::default()
    }
}
