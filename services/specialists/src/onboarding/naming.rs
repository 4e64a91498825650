//! The project's name: from its manifests, else its README's title.

/// Longest project name taken from a README title, in characters.
pub(super) const TITLE_NAME_MAX_CHARS: usize = 60;

/// The README's first level-one heading (Markdown `# `, AsciiDoc's document
/// title `= `), without markup and without what follows a dash, a colon or
/// a full stop ("Zopu — an event-sourced runtime" and "pest. The Elegant
/// Parser" name Zopu and pest).
pub fn readme_title(content: &str) -> Option<String> {
    let mut in_fence = false;
    for line in content.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        let Some(heading) = trimmed
            .strip_prefix("# ")
            .or_else(|| trimmed.strip_prefix("= "))
            .filter(|_| !in_fence)
        else {
            continue;
        };
        let plain: String = heading
            .chars()
            .filter(|c| !matches!(c, '*' | '_' | '`' | '[' | ']'))
            .collect();
        let name = [" — ", " – ", " - ", ": ", ". "]
            .iter()
            .fold(plain.as_str(), |name, separator| {
                name.split(separator).next().unwrap_or(name)
            })
            .trim();
        return (!name.is_empty() && name.chars().count() <= TITLE_NAME_MAX_CHARS)
            .then(|| name.to_owned());
    }
    None
}

/// The repository's name: the root manifest's package, else the README's
/// title, else what the packages' names share ("acme-core", "acme-cli":
/// "acme"), else the shallowest package, else "this repository". A
/// workspace's member is never taken for the whole when something better
/// names it.
pub fn project_name(names: &[(String, String)], readme_title: Option<&str>) -> String {
    if let Some((_, root)) = names.iter().find(|(path, _)| !path.contains('/')) {
        // The README's title is how the maintainers write the same name
        // (`Commander.js` for the package `commander`, `JavaPoet` for
        // `javapoet`).
        let letters = |text: &str| -> String {
            text.chars()
                .filter(|c| c.is_alphanumeric())
                .flat_map(char::to_lowercase)
                .collect()
        };
        return match readme_title {
            Some(title)
                if !letters(root).is_empty() && letters(title).starts_with(&letters(root)) =>
            {
                title.to_owned()
            }
            _ => root.clone(),
        };
    }
    if let Some(title) = readme_title {
        return title.to_owned();
    }
    let words = |name: &str| -> Vec<String> {
        name.split(['-', '_', '.', '/'])
            .map(str::to_owned)
            .collect()
    };
    if names.len() >= 2 {
        let first = words(&names[0].1);
        let shared = names.iter().skip(1).fold(first.len(), |shared, (_, name)| {
            let other = words(name);
            first
                .iter()
                .zip(&other)
                .take(shared)
                .take_while(|(a, b)| a == b)
                .count()
        });
        if shared > 0 {
            return first[..shared].join("-");
        }
    }
    names
        .first()
        .map_or_else(|| "this repository".to_owned(), |(_, name)| name.clone())
}
