// Validates the checked-in AsyncAPI document with the AsyncAPI project's own
// parser (@asyncapi/parser from the npm registry, installed by
// contract-check.sh under tools/asyncapi, never committed).
// Usage: node asyncapi-validate.cjs <parser install dir> <document>
// Exit 0: valid (warnings are printed); 1: errors (each printed with its path).
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const { createRequire } = require('node:module');

async function main() {
  const [installDir, documentPath] = process.argv.slice(2);
  if (!installDir || !documentPath) {
    console.error('usage: node asyncapi-validate.cjs <parser install dir> <document>');
    return 1;
  }
  const load = createRequire(path.join(path.resolve(installDir), 'package.json'));
  const { Parser, DiagnosticSeverity } = load('@asyncapi/parser');
  const text = fs.readFileSync(documentPath, 'utf8');
  const { document, diagnostics } = await new Parser().parse(text);
  const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
  for (const d of diagnostics) {
    const level = d.severity === DiagnosticSeverity.Error ? 'error' : 'warning';
    console.log(`${level}: ${d.code} at /${d.path.join('/')}: ${d.message}`);
  }
  if (!document || errors.length > 0) {
    console.error(`FAIL: ${documentPath} is not a valid AsyncAPI document (${errors.length} error(s))`);
    return 1;
  }
  console.log(
    `ok: ${documentPath} is valid AsyncAPI ${document.version()}: ` +
      `${document.channels().length} channels, ${document.operations().length} operations, ` +
      `${document.components().messages().length} messages`,
  );
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    console.error(`FAIL: ${error.stack || error}`);
    process.exit(1);
  },
);
