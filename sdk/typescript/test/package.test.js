// The package itself: its manifest, and type declarations that cover every export.

import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as sdk from '../src/index.js';

const root = new URL('../', import.meta.url);
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8'));
const dts = readFileSync(new URL('src/index.d.ts', root), 'utf8');

describe('package', () => {
  it('is an ESM package with exports and types, and no runtime dependencies', () => {
    assert.equal(pkg.name, '@cella/sdk');
    assert.equal(pkg.type, 'module');
    assert.equal(pkg.types, './src/index.d.ts');
    assert.equal(pkg.exports['.'].import, './src/index.js');
    assert.equal(pkg.exports['.'].types, './src/index.d.ts');
    assert.equal(pkg.dependencies, undefined);
  });

  it('declares a type for every runtime export', () => {
    for (const name of Object.keys(sdk)) {
      assert.match(dts, new RegExp(`export declare (class|const|function) ${name}\\b`), `${name} is not declared`);
    }
  });

  it('declares every method of the public classes', () => {
    const classes = ['Sandbox', 'Commands', 'CommandHandle', 'Files', 'WatchHandle', 'CodeInterpreter', 'Snapshot', 'Artifact', 'Template', 'TemplateBuild'];
    for (const cls of classes) {
      const body = dts.slice(dts.indexOf(`export declare class ${cls} `));
      const end = body.indexOf('\n}\n');
      const decl = body.slice(0, end);
      const methods = Object.getOwnPropertyNames(sdk[cls].prototype).filter((m) => m !== 'constructor' && !m.startsWith('_'));
      for (const m of methods) assert.match(decl, new RegExp(`\\b${m}\\b`), `${cls}.${m} is not declared`);
      const statics = Object.getOwnPropertyNames(sdk[cls]).filter((m) => !['length', 'name', 'prototype'].includes(m));
      for (const m of statics) assert.match(decl, new RegExp(`static ${m}\\(`), `static ${cls}.${m} is not declared`);
    }
  });

  it('the error classes form the documented hierarchy', () => {
    for (const name of Object.keys(sdk).filter((n) => n.endsWith('Error'))) {
      assert.ok(new sdk[name]('x') instanceof sdk.CellaError, name);
      assert.equal(new sdk[name]('x').name, name);
    }
    assert.ok(new sdk.UnknownLanguageError('x') instanceof sdk.InvalidRequestError);
    assert.ok(new sdk.ConcurrencyLimitError('x') instanceof sdk.RateLimitedError);
  });
});
