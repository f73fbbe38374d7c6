"""The page at ``/``: chat with a chosen memory, see what steered each answer, correct it in one
click. Plain HTML and JavaScript, no build step; it calls the same endpoints as any client. The API
key typed into it is kept for the browser tab's session only (``sessionStorage``), and typing it
reloads the list of memories."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>miita-edge</title>
<style>
body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;color:#222}
input,select,button{font-size:1rem;padding:.35rem}#query,#correction{width:60%}
.turn{border:1px solid #ddd;border-radius:6px;padding:.6rem;margin:.6rem 0}
.why{color:#555;font-size:.85rem}.err{color:#b00}
</style></head><body>
<h1>miita-edge</h1>
<p>Memory: <select id="model"></select> <label><input type="checkbox" id="adapt" checked> adapt</label>
 <input id="key" type="password" autocomplete="off" placeholder="API key (if any)" size="14"></p>
<p><input id="query" placeholder="Ask something"> <button id="ask">Ask</button></p>
<div id="log"></div>
<p id="status" class="why"></p>
<script>
const $ = (id) => document.getElementById(id);
function headers(){const h={"Content-Type":"application/json"};if($("key").value)h.Authorization="Bearer "+$("key").value;return h;}
async function call(method, path, body){
  const r = await fetch(path,{method,headers:headers(),body:body===undefined?undefined:JSON.stringify(body)});
  const j = await r.json(); if(!r.ok) throw new Error((j.error&&j.error.message)||r.status); return j;}
function showError(e){$("status").innerHTML="";const s=document.createElement("span");s.className="err";s.textContent=e.message;$("status").append(s);}
async function loadModels(){
  $("model").innerHTML="";
  const j = await call("GET","/v1/models");
  for(const m of j.data){const o=document.createElement("option");o.value=o.textContent=m.id;$("model").appendChild(o);}
  if(j.data.length>1) $("model").value=j.data[1].id;
  $("status").textContent="";}
let keyTimer=null;
function keyTyped(){sessionStorage.setItem("miita-edge-key",$("key").value);
  clearTimeout(keyTimer); keyTimer=setTimeout(()=>loadModels().catch(showError),250);}
function memoryName(){const v=$("model").value;const i=v.indexOf(":");return i<0?null:v.slice(i+1);}
async function ask(){
  const q=$("query").value.trim(); if(!q) return;
  $("status").textContent="answering…";
  try{
    const j=await call("POST","/v1/chat/completions",{model:$("model").value,max_tokens:16,
      messages:[{role:"user",content:q}],miita:{adapt:$("adapt").checked}});
    const text=j.choices[0].message.content, x=j.miita||{};
    const turn=document.createElement("div"); turn.className="turn";
    const qa=document.createElement("div"); qa.innerHTML="<b>Q</b> ";qa.append(q);
    const a=document.createElement("div"); a.className="answer"; a.innerHTML="<b>A</b> ";
    const at=document.createElement("span"); at.className="answer-text"; at.textContent=text; a.append(at);
    const why=document.createElement("div"); why.className="why";
    why.textContent = x.adapted ? ("memory "+x.memory+" v"+x.version+" steered by: "+
      (x.steered_by||[]).map(s=>JSON.stringify(s.answer)+" ×"+s.weight.toFixed(2)).join(", "))
      : "not adapted (frozen model)"+(x.reason ? ": "+x.reason : "");
    turn.append(qa,a,why);
    if(memoryName()){
      const fix=document.createElement("div");
      const inp=document.createElement("input"); inp.className="correction"; inp.placeholder="the answer should have been …";
      const b=document.createElement("button"); b.className="teach"; b.textContent="Correct";
      b.onclick=async()=>{const out=inp.value.trim(); if(!out) return;
        $("status").textContent="teaching…";
        try{const r=await call("POST","/v1/memories/"+encodeURIComponent(memoryName())+"/examples",[{input:q,output:out}]);
            $("status").textContent="taught: memory version "+r.version+" ("+r.prototypes+" prototypes). Ask again to see it.";}
        catch(e){showError(e);}};
      fix.append("The answer should have been ",inp," ",b); turn.append(fix);}
    $("log").prepend(turn); $("status").textContent="done";
  }catch(e){showError(e);}
}
$("ask").onclick=ask; $("query").addEventListener("keydown",e=>{if(e.key==="Enter")ask();});
$("key").value=sessionStorage.getItem("miita-edge-key")||""; $("key").addEventListener("input",keyTyped);
loadModels().catch(showError);
</script></body></html>
"""
