// Verifies requests with the reference Standard Webhooks library. Everything
// comes on stdin, secrets included (never on the command line):
//   {"secrets": ["whsec_…", …], "cases": [{"secret": 0, "headers": {…}, "body": "<base64>"}, …]}
// and one result per case goes to stdout: [{"ok": true} | {"ok": false, "error": "…"}, …].
"use strict";
const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const { secrets, cases } = JSON.parse(input);
  const results = cases.map((c) => {
    try {
      new Webhook(secrets[c.secret]).verify(Buffer.from(c.body, "base64"), c.headers);
      return { ok: true };
    } catch (e) {
      return { ok: false, error: String(e && e.message) };
    }
  });
  process.stdout.write(JSON.stringify(results));
});
