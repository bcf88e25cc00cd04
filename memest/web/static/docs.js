// Renders /openapi.json as a list of endpoints and their request fields (no network beyond this server).
"use strict";
(async () => {
  const doc = await (await fetch("/openapi.json")).json();
  const main = document.getElementById("docs");
  main.replaceChildren();
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const h = document.createElement("h2");
      h.textContent = `${method.toUpperCase()} ${path}: ${op.summary}`;
      main.appendChild(h);
      const schema = op.requestBody && op.requestBody.content["application/json"].schema;
      if (!schema) continue;
      const table = document.createElement("table");
      table.innerHTML = "<thead><tr><th>field</th><th>type</th><th>default</th><th>meaning</th></tr></thead>";
      const body = document.createElement("tbody");
      for (const [name, f] of Object.entries(schema.properties)) {
        const tr = document.createElement("tr");
        const type = f.enum ? f.enum.join(" | ") : f.type || (f.oneOf || []).map((o) => o.type).join(" | ");
        for (const cell of [name, type, f.default === undefined ? "" : JSON.stringify(f.default), f.description || ""]) {
          const td = document.createElement("td");
          td.textContent = cell;
          tr.appendChild(td);
        }
        body.appendChild(tr);
      }
      table.appendChild(body);
      main.appendChild(table);
    }
  }
})();
