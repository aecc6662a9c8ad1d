// The eval viewer: one script for the self-contained report (its data embedded in the page) and
// for the pages `wesichain api` serves at /evals/ (which read the caller's evals from /v1/evals
// with the caller's key). No dependencies, no build step. Every text of an eval is untrusted: it
// only ever goes into the page as textContent or an attribute, never as markup.
(function(){
'use strict';
var boot=JSON.parse(document.getElementById('eval-data').textContent);
var root=document.getElementById('viewer');
var KEY_STORE='wesichain.key';  // the console's: one sign-in serves both
var SVGNS='http://www.w3.org/2000/svg';
var PALETTE=['#1a7f37','#0969da','#bf3989','#9a6700','#8250df','#cf222e','#1b7c83','#57606a'];

function el(tag,attrs,text){var e=document.createElement(tag);if(attrs){for(var k in attrs){if(attrs[k]!==null&&attrs[k]!==undefined){e.setAttribute(k,attrs[k]);}}}
 if(text!==undefined&&text!==null){e.textContent=String(text);}return e;}
function sv(tag,attrs,text){var e=document.createElementNS(SVGNS,tag);for(var k in attrs||{}){e.setAttribute(k,String(attrs[k]));}
 if(text!==undefined&&text!==null){e.textContent=String(text);}return e;}
function add(parent){for(var i=1;i<arguments.length;i++){if(arguments[i]){parent.appendChild(arguments[i]);}}return parent;}
function pct(x){return x===null||x===undefined?'-':(x*100).toFixed(1)+'%';}
function when(t){if(!t){return '-';}var d=new Date(t*1000);return d.toISOString().replace('T',' ').slice(0,19)+' UTC';}
function took(s){if(s===null||s===undefined){return '-';}if(s<120){return s.toFixed(1)+' s';}if(s<7200){return (s/60).toFixed(1)+' min';}return (s/3600).toFixed(1)+' h';}
function ready(){document.body.setAttribute('data-ready','1');}
function fail(message){root.textContent='';add(root,el('h1',null,'Evals'),el('p',{'class':'error',id:'viewer-error'},message));ready();}

// -- the HTTP API (served pages only) ------------------------------------------------------------
function api(path,options){options=options||{};var headers={'Accept':'application/json'};
 var key=sessionStorage.getItem(KEY_STORE);if(key){headers.Authorization='Bearer '+key;}
 if(options.body){headers['Content-Type']='application/json';}
 return fetch(path,{method:options.method||'GET',headers:headers,body:options.body,credentials:'same-origin'}).then(function(res){
  return res.json().catch(function(){return {};}).then(function(body){if(res.ok){return body;}
   var err=new Error((body.error&&body.error.message)||('HTTP '+res.status));err.status=res.status;throw err;});});}
function askKey(message,retry){root.textContent='';var form=el('form',{id:'key-form'});
 var input=el('input',{type:'password',id:'key-input',placeholder:'wsk_...',autocomplete:'off'});
 add(form,el('h1',null,'Evals'),el('p',null,message||'Sign in with an API key to see your evals.'),input,el('button',{type:'submit'},'Sign in'));
 form.addEventListener('submit',function(ev){ev.preventDefault();sessionStorage.setItem(KEY_STORE,input.value.trim());retry();});
 root.appendChild(form);ready();}
function guarded(promise,retry){return promise.catch(function(err){if(err.status===401){askKey(sessionStorage.getItem(KEY_STORE)?'That key was refused.':'',retry);}
 else{fail(err.message);}});}

// -- charts: inline SVG drawn here -------------------------------------------------------------
function rateBar(rate,low,high){var w=160,s=sv('svg',{'class':'rate',viewBox:'0 0 '+w+' 14',width:w,height:14,role:'img'});
 add(s,sv('rect',{'class':'track',x:0,y:3,width:w,height:8}),sv('rect',{'class':'ci',x:(low*w).toFixed(1),y:1,width:Math.max(1,(high-low)*w).toFixed(1),height:12}),
  sv('rect',{'class':'point',x:(rate*w-1).toFixed(1),y:0,width:3,height:14}),sv('title',null,pct(rate)+' (95% CI '+pct(low)+'-'+pct(high)+')'));return s;}
function histogram(h){var width=260,height=70;if(!h.counts.length){return sv('svg',{'class':'hist',width:0,height:0});}
 var s=sv('svg',{'class':'hist',viewBox:'0 0 '+width+' '+(height+14),width:width,height:height+14,role:'img'});
 var top=Math.max.apply(null,h.counts),bar=width/h.counts.length;
 h.counts.forEach(function(c,i){if(c){var r=sv('rect',{x:(i*bar).toFixed(1),y:(height-c/top*height).toFixed(1),width:(bar-1).toFixed(1),height:(c/top*height).toFixed(1)});r.appendChild(sv('title',null,c));s.appendChild(r);}});
 add(s,sv('text',{x:0,y:height+12},Number(h.low).toPrecision(3)),sv('text',{x:width,y:height+12,'text-anchor':'end'},Number(h.high).toPrecision(3)));return s;}
// One line per series over the evals in time order; y from 0 to 1.
function trend(title,xs,series){var W=520,H=160,L=34,B=18,fig=el('figure',{'class':'trend'});fig.appendChild(el('figcaption',null,title));
 var s=sv('svg',{'class':'trend',viewBox:'0 0 '+W+' '+(H+B),width:W,height:H+B,role:'img'});
 [0,0.5,1].forEach(function(y){var py=H-y*(H-10);add(s,sv('line',{x1:L,x2:W,y1:py,y2:py,'class':'grid'}),sv('text',{x:0,y:py+4},(y*100)+'%'));});
 var x=function(i){return xs.length<2?L+(W-L)/2:L+i*(W-L-10)/(xs.length-1);};
 series.forEach(function(se,k){var color=PALETTE[k%PALETTE.length],pts=[];
  se.values.forEach(function(v,i){if(v!==null&&v!==undefined){pts.push(x(i).toFixed(1)+','+(H-v*(H-10)).toFixed(1));}});
  if(pts.length>1){s.appendChild(sv('polyline',{points:pts.join(' '),fill:'none',stroke:color,'stroke-width':2}));}
  se.values.forEach(function(v,i){if(v!==null&&v!==undefined){var c=sv('circle',{cx:x(i).toFixed(1),cy:(H-v*(H-10)).toFixed(1),r:3.5,fill:color});
   c.appendChild(sv('title',null,se.name+' @ '+xs[i]+': '+pct(v)));s.appendChild(c);}});});
 fig.appendChild(s);var legend=el('div',{'class':'legend'});
 series.forEach(function(se,k){var item=el('span',null,se.name);item.style.borderColor=PALETTE[k%PALETTE.length];legend.appendChild(item);});
 fig.appendChild(legend);return fig;}

// -- a word diff of an answer against the expected answer ---------------------------------------
function words(t){return t.split(/(\s+)/).filter(function(w){return w!=='';});}
function diff(expected,answer){var a=words(expected).slice(0,400),b=words(answer).slice(0,400),n=a.length,m=b.length,i,j;
 var t=[];for(i=0;i<=n;i++){t.push(new Array(m+1).fill(0));}
 for(i=n-1;i>=0;i--){for(j=m-1;j>=0;j--){t[i][j]=a[i]===b[j]?t[i+1][j+1]+1:Math.max(t[i+1][j],t[i][j+1]);}}
 var out=el('div',{'class':'diff'});out.appendChild(el('span',{'class':'dk'},'answer against expected: '));
 i=0;j=0;while(i<n||j<m){if(i<n&&j<m&&a[i]===b[j]){out.appendChild(el('span',null,a[i]));i++;j++;}
  else if(j<m&&(i>=n||t[i][j+1]>=t[i+1][j])){out.appendChild(el('ins',null,b[j]));j++;}
  else{out.appendChild(el('del',null,a[i]));i++;}}
 return out;}
function plainExpected(text){if(!text){return '';}try{var v=JSON.parse(text);return typeof v==='string'?v:text;}catch(e){return text;}}

// -- one eval ----------------------------------------------------------------------------------
function renderEval(data,live){
 var V=data.variants,T=data.strings,H=data.header,labels=data.labels||{};
 document.title='Eval '+data.eval;root.textContent='';
 function S(i){return i===null||i===undefined?'':T[i];}
 add(root,el('h1',null,'Eval '+data.eval));
 if(live){var nav=el('p',{'class':'nav'});add(nav,el('a',{href:'/evals/'},'\u2190 all evals'),document.createTextNode(' \u00b7 '),el('a',{href:'/',id:'console-link'},'the run console'));root.appendChild(nav);}
 add(root,el('p',{'class':'meta'},'status '+H.status+' \u00b7 dataset '+H.dataset+' \u00b7 '+H.cases+' cases x '+V.length+' variants x '+H.repeats+' repeats \u00b7 CI pass threshold '+Math.round(data.verdict.threshold*100)+'%'));
 // The gate's verdict first.
 var vd=data.verdict,banner=el('div',{'class':'verdict '+vd.verdict,id:'verdict'});
 var words_={pass:'PASS: every variant reaches the '+pct(vd.threshold)+' pass threshold.',
  fail:'FAIL: no variant reaches the '+pct(vd.threshold)+' pass threshold.',
  mixed:'MIXED: '+vd.above.join(', ')+' reach'+(vd.above.length===1?'es':'')+' the '+pct(vd.threshold)+' pass threshold, '+vd.below.join(', ')+' do'+(vd.below.length===1?'es':'')+' not. The CI gate (eval run --wait, eval status --gate) requires every variant, so it fails (exit 1).'};
 add(banner,el('b',null,vd.verdict.toUpperCase()),el('span',null,' '+words_[vd.verdict].replace(/^[A-Z]+: /,'')+(vd.final?'':' Provisional: the eval is '+H.status+'.')));
 root.appendChild(banner);
 // Context: when, how long, what, which code.
 var ctx=H.context||{},facts=el('dl',{'class':'context',id:'context'});
 var duration=H.finished_at?H.finished_at-H.created_at:null;
 [['spec',H.name+(ctx.spec_file?' ('+ctx.spec_file+')':'')],['spec sha256',ctx.spec_sha256||'-'],['dataset',H.dataset],['dataset sha256',ctx.dataset_sha256||'-'],
  ['ran',when(H.created_at)],['took',took(duration)],['code version',ctx.code_version||'unknown (the agents are not in a git checkout)'],
  ['scorers',H.scorers.map(function(s){return (s.name||s.kind)+' ('+s.kind+(s.threshold!==undefined?', \u2265 '+s.threshold:'')+')';}).join(', ')],
  ['concurrency',String(H.concurrency)+(H.namespace?' on namespace '+H.namespace:'')]].forEach(function(f){add(facts,el('dt',null,f[0]),el('dd',null,f[1]));});
 root.appendChild(facts);
 var vt=el('table',{'class':'variants',id:'variant-settings'});
 add(vt,add(el('thead'),add(el('tr'),el('th',null,'variant'),el('th',null,'agent'),el('th',null,'model'),el('th',null,'settings'))));
 var vb=el('tbody');H.variants.forEach(function(v){add(vb,add(el('tr'),el('th',null,v.name),el('td',null,v.agent),el('td',null,v.model||'(the agent\u2019s)'),
  el('td',null,Object.keys(v.metadata||{}).length?JSON.stringify(v.metadata):'-')));});vt.appendChild(vb);root.appendChild(vt);
 // The summary.
 var scorers=[],ks=[];data.summary.forEach(function(s){Object.keys(s.scores).forEach(function(n){if(scorers.indexOf(n)<0){scorers.push(n);}});
  Object.keys(s.pass_at).forEach(function(k){if(ks.indexOf(k)<0){ks.push(k);}});});scorers.sort();
 var anyLabels=Object.keys(labels).length>0;
 add(root,el('h2',null,'Summary'));var section=el('section',{id:'summary'}),table=el('table',{'class':'summary'}),hr=el('tr');
 ['variant','runs','pass rate [95% CI]','runs failed'].concat(scorers).concat(ks.map(function(k){return 'pass@'+k;})).concat(['latency p50 / p95','tokens','cost']).concat(anyLabels?['human agreement']:[])
  .forEach(function(h){hr.appendChild(el('th',null,h));});
 add(table,add(el('thead'),hr));var tb=el('tbody');
 data.summary.forEach(function(s){var tr=el('tr',{'class':s.runs&&s.rate>=vd.threshold?'ok':'below'});tr.appendChild(el('th',null,s.name));tr.appendChild(el('td',null,s.runs));
  var rc=el('td');add(rc,document.createTextNode(pct(s.rate)+' '),el('small',null,'['+pct(s.low)+'-'+pct(s.high)+']'),el('br'),rateBar(s.rate,s.low,s.high));tr.appendChild(rc);
  tr.appendChild(el('td',null,s.failed_runs));scorers.forEach(function(n){tr.appendChild(el('td',null,n in s.scores?s.scores[n].toFixed(3):'-'));});
  ks.forEach(function(k){tr.appendChild(el('td',null,pct(s.pass_at[k]||0)));});
  add(tr,el('td',null,s.p50_s.toFixed(2)+'s / '+s.p95_s.toFixed(2)+'s'),el('td',null,s.tokens),el('td',null,'$'+s.cost_usd.toFixed(4)));
  if(anyLabels){var ag=data.agreement[s.name];tr.appendChild(el('td',{'class':'agreement'},ag.labelled?pct(ag.rate)+' of '+ag.labelled+' labelled, \u03ba '+(ag.kappa===null?'-':ag.kappa.toFixed(2)):'-'));}
  tb.appendChild(tr);});
 table.appendChild(tb);section.appendChild(table);root.appendChild(section);
 // Breakdown by a dataset field.
 var fields=Object.keys(data.breakdown||{});
 if(fields.length){add(root,el('h2',null,'Breakdown by dataset field'));var bsec=el('section',{id:'breakdown'});
  var pick=el('select',{id:'group-by'});fields.forEach(function(f){pick.appendChild(el('option',{value:f},f));});
  add(bsec,add(el('div',{'class':'controls'}),el('label',{'for':'group-by'},'group by '),pick));var holder=el('div');bsec.appendChild(holder);root.appendChild(bsec);
  var drawBreakdown=function(){var f=pick.value,bt=el('table',{'class':'breakdown'}),h=el('tr');add(h,el('th',null,f),el('th',null,'cases'));
   V.forEach(function(v){add(h,el('th',null,v+': pass rate [95% CI]'),el('th',null,v+': scores'),el('th',null,v+': cost / p50'));});
   add(bt,add(el('thead'),h));var b=el('tbody');
   data.breakdown[f].forEach(function(g){var tr=el('tr',{'class':'group','data-value':g.value});var cell=el('th');var a=el('a',{href:'#',title:'show these cases'},g.value);
    a.addEventListener('click',function(ev){ev.preventDefault();group=[f,g.value];render();document.getElementById('cases').scrollIntoView();});cell.appendChild(a);add(tr,cell,el('td',null,g.cases));
    g.variants.forEach(function(s){var rc=el('td');add(rc,document.createTextNode(pct(s.rate)+' '),el('small',null,'['+pct(s.low)+'-'+pct(s.high)+'] of '+s.runs),el('br'),rateBar(s.rate,s.low,s.high));
     add(tr,rc,el('td',null,Object.keys(s.scores).sort().map(function(n){return n+' '+s.scores[n].toFixed(2);}).join(', ')||'-'),el('td',null,'$'+s.cost_usd.toFixed(4)+' / '+s.p50_s.toFixed(2)+'s'));});
    b.appendChild(tr);});bt.appendChild(b);holder.textContent='';holder.appendChild(bt);};
  pick.addEventListener('change',drawBreakdown);drawBreakdown();}
 // Distributions.
 add(root,el('h2',null,'Distributions'));var charts=el('div',{'class':'charts'});
 data.summary.forEach(function(s){add(charts,add(el('figure'),el('figcaption',null,s.name+': latency (s)'),histogram(s.latency)),add(el('figure'),el('figcaption',null,s.name+': tokens per run'),histogram(s.token_hist)));});
 root.appendChild(charts);
 // Failures.
 add(root,el('h2',null,'Failures by kind'));
 if(!data.failures.length){root.appendChild(el('p',null,'No run failed and no scorer raised.'));}
 else{var ul=el('ul',{'class':'failures'});data.failures.forEach(function(f){var li=el('li');add(li,el('b',null,f.kind),document.createTextNode(' x'+f.n+': '),el('q',null,f.message),document.createTextNode(' '),el('small',null,'e.g. '+f.examples.join(', ')));ul.appendChild(li);});root.appendChild(ul);}
 if(data.checks.scorers.length){var ct=el('table',{'class':'checks'}),ch=el('tr');ch.appendChild(el('th',null,'failed checks'));data.checks.scorers.forEach(function(n){ch.appendChild(el('th',null,n));});
  add(ct,add(el('thead'),ch));var cb=el('tbody');data.checks.rows.forEach(function(r){var tr=el('tr');tr.appendChild(el('th',null,r[0]));r.slice(1).forEach(function(n){tr.appendChild(el('td',null,n));});cb.appendChild(tr);});ct.appendChild(cb);root.appendChild(ct);}
 // Variants against the first.
 if(data.comparisons.length){add(root,el('h2',null,'Comparison'));root.appendChild(comparisonTable(data.comparisons));}
 // Another eval against this one (served: the server runs the paired test).
 var other=el('section',{id:'compare-evals'});root.appendChild(other);
 // The cases.
 add(root,el('h2',null,'Cases'));
 var search=el('input',{id:'case-filter',type:'search',placeholder:'filter by id, input, expected or answer'});
 var which=el('select',{id:'case-which'});[['all','all cases'],['failing','failing'],['passing','passing'],['differ','variants differ'],['errors','errors'],['labelled','reviewed'],['unlabelled','not reviewed'],['disagree','human disagrees']]
  .forEach(function(o){which.appendChild(el('option',{value:o[0]},o[1]));});
 var count=el('span',{id:'case-count'}),groupNote=el('span',{id:'case-group'});
 add(root,add(el('div',{'class':'controls'}),search,which,count,groupNote));
 var ctable=el('table',{id:'cases'}),head=el('tr',{id:'case-head'}),body=el('tbody',{id:'case-rows'});add(ctable,add(el('thead'),head),body);root.appendChild(ctable);
 // focus: the case run a link named (#item=V:C:R, as the console's run page links to it): its case opens, its box is marked.
 var review=live||anyLabels,sortKey='i',sortDir=1,open={},group=null,compareWith=null,focus=null;
 function item(c,r){return r.v+':'+c.i+':'+r.r;}
 function passes(c,v){var n=0,t=0;c.runs.forEach(function(r){if(r.v===v){t++;if(r.ok){n++;}}});return [n,t];}
 function status(c){var all=true,none=true;c.runs.forEach(function(r){if(r.ok){none=false;}else{all=false;}});return all?'pass':(none?'fail':'mixed');}
 function differs(c){var s=V.map(function(_,v){var p=passes(c,v);return p[1]?p[0]/p[1]:-1;});return s.some(function(x){return x!==s[0];});}
 function caseLabels(c){return c.runs.map(function(r){return labels[item(c,r)];}).filter(function(a){return a&&a.label;});}
 function disagrees(c){return c.runs.some(function(r){var a=labels[item(c,r)];return a&&a.label&&(a.label==='pass')!==r.ok;});}
 function key(c){if(sortKey==='id'){return c.id;}if(sortKey==='status'){return status(c);}
  if(sortKey.charAt(0)==='v'){var p=passes(c,+sortKey.slice(1));return p[1]?p[0]/p[1]:-1;}return c.i;}
 function visible(c){var q=search.value.trim().toLowerCase(),w=which.value;
  if(group&&(c.f||{})[group[0]]!==group[1]){return false;}
  if(q&&(c.id+' '+c.input+' '+c.expected+' '+c.runs.map(function(r){return r.a||'';}).join(' ')).toLowerCase().indexOf(q)<0){return false;}
  if(w==='failing'){return status(c)!=='pass';}if(w==='passing'){return status(c)==='pass';}if(w==='differ'){return differs(c);}
  if(w==='errors'){return c.runs.some(function(r){return r.ek;});}if(w==='labelled'){return caseLabels(c).length>0;}
  if(w==='unlabelled'){return caseLabels(c).length===0;}if(w==='disagree'){return disagrees(c);}return true;}
 function runId(c,r){return data.eval+':v'+r.v+':c'+c.i+':r'+r.r;}
 function humanBox(c,r){var it=item(c,r),a=labels[it],box=el('div',{'class':'human','data-item':it});
  if(a){var line=el('p',{'class':'label'});add(line,el('b',{'class':a.label==='pass'?'pass':(a.label==='fail'?'fail':'')},'human: '+(a.label||'no verdict')),
    document.createTextNode(' by '+a.by+' at '+when(a.at)+(a.label&&((a.label==='pass')!==r.ok)?' (disagrees with the scorers)':'')));box.appendChild(line);
   var over=Object.keys(a.scores||{});if(over.length){box.appendChild(el('p',{'class':'overrides'},'scores overridden: '+over.map(function(n){return n+' = '+a.scores[n];}).join(', ')));}
   if(a.note){box.appendChild(el('p',{'class':'note'},a.note));}}
  if(!live){return (a?box:null);}
  var form=el('form',{'class':'annotate'}),sel=el('select',{name:'label'});[['','no verdict'],['pass','pass'],['fail','fail']].forEach(function(o){sel.appendChild(el('option',{value:o[0]},o[1]));});
  sel.value=a&&a.label?a.label:'';add(form,el('label',null,'verdict '),sel);
  var inputs={};r.sc.forEach(function(s){var name=S(s[0]),inp=el('input',{type:'number',min:'0',max:'1',step:'0.01',name:'score:'+name,placeholder:String(s[1])});
   if(a&&a.scores&&name in a.scores){inp.value=String(a.scores[name]);}inputs[name]=inp;add(form,el('label',null,' '+name+' '),inp);});
  var note=el('textarea',{name:'note',maxlength:'2000',rows:'2',placeholder:'comment'});note.value=a?a.note:'';form.appendChild(note);
  var msg=el('span',{'class':'saved'});add(form,el('button',{type:'submit'},'Save review'),msg);
  form.addEventListener('click',function(ev){ev.stopPropagation();});
  form.addEventListener('submit',function(ev){ev.preventDefault();var scores={};Object.keys(inputs).forEach(function(n){if(inputs[n].value!==''){scores[n]=Number(inputs[n].value);}});
   var payload={label:sel.value||null,scores:scores,note:note.value};msg.textContent='saving\u2026';
   api('/v1/evals/'+encodeURIComponent(data.eval)+'/annotations/'+encodeURIComponent(it),{method:'PUT',body:JSON.stringify(payload)})
    .then(function(saved){labels[it]=saved;render();}).catch(function(err){msg.textContent=err.message;});});
  box.appendChild(form);return box;}
 function drill(c){var td=el('td',{colspan:String(V.length+3+(review?1:0))});
  add(td,el('div',{'class':'k'},'input'),el('pre',null,c.input),el('div',{'class':'k'},'expected'),el('pre',null,c.expected));
  var side=el('div',{'class':'side'});
  c.runs.slice().sort(function(a,b){return a.v-b.v||a.r-b.r;}).forEach(function(r){
   var box=el('div',{'class':'run'+(item(c,r)===focus?' focus':''),'data-item':item(c,r)});box.appendChild(el('h4',null,V[r.v]+(r.r?' #'+r.r:'')+' \u2014 '+(r.ok?'pass':'fail')+' ('+r.st+')'));
   add(box,el('div',{'class':'k'},'answer'),el('pre',null,r.a===null?'(none)':r.a));
   if(r.a!==null&&c.expected){box.appendChild(diff(plainExpected(c.expected),r.a));}
   if(r.e){add(box,el('div',{'class':'k'},'error ('+r.ek+')'),el('pre',null,r.e));}
   var ul=el('ul');r.sc.forEach(function(s){ul.appendChild(el('li',null,S(s[0])+': '+s[1]+(s[2]?' \u2713 ':' \u2717 ')+S(s[3])));});box.appendChild(ul);
   box.appendChild(el('div',{'class':'k'},'trajectory ('+r.steps+' steps, '+r.tok+' tokens, '+r.lat.toFixed(2)+'s, run '+runId(c,r)+')'));
   var ol=el('ol',{'class':'traj'});r.tr.forEach(function(t){var text=t[0]==='c'?('call '+S(t[1])+'('+S(t[3])+')'):(t[0]==='r'?('result of '+S(t[1])+': '+S(t[2])):('thought: '+S(t[2])));ol.appendChild(el('li',null,text));});
   box.appendChild(ol);
   // The run's page in the console: conversation, tool calls, tokens and latency per step, timeline.
   if(live&&/^[A-Za-z0-9_.:-]+$/.test(runId(c,r))){var links=el('p',{'class':'links'});var link=el('a',{'class':'run-link',href:'/#/runs/'+runId(c,r),target:'_blank',rel:'noopener'},'open the run in the console');
    link.addEventListener('click',function(ev){ev.stopPropagation();});links.appendChild(link);box.appendChild(links);}
   var human=humanBox(c,r);if(human){box.appendChild(human);}
   side.appendChild(box);});
  td.appendChild(side);var tr=el('tr',{'class':'drill'});tr.appendChild(td);return tr;}
 function renderRows(){var rows=data.cases.filter(visible).sort(function(a,b){var x=key(a),y=key(b);return (x<y?-1:x>y?1:0)*sortDir;});
  body.textContent='';rows.forEach(function(c){var st=status(c);var tr=el('tr',{'class':'case','data-case':c.id});
   tr.appendChild(el('td',null,c.id));tr.appendChild(el('td',null,c.input.length>90?c.input.slice(0,90)+'\u2026':c.input));
   V.forEach(function(_,v){var p=passes(c,v);tr.appendChild(el('td',{'class':p[0]===p[1]?'pass':'fail'},p[0]+'/'+p[1]));});
   tr.appendChild(el('td',{'class':st==='pass'?'pass':'fail'},st));
   if(review){var ls=caseLabels(c);tr.appendChild(el('td',{'class':'review'+(disagrees(c)?' disagree':'')},ls.length?ls.map(function(a){return a.label;}).join(' '):'-'));}
   tr.addEventListener('click',function(){open[c.id]=!open[c.id];render();});body.appendChild(tr);
   if(open[c.id]){body.appendChild(drill(c));}});
  count.textContent=rows.length+' of '+data.cases.length+' cases';
  groupNote.textContent='';if(group){var clear=el('a',{href:'#'},'\u00d7');clear.addEventListener('click',function(ev){ev.preventDefault();group=null;render();});
   add(groupNote,document.createTextNode(' '+group[0]+' = '+group[1]+' '),clear);}}
 [['id','case'],['input','input']].concat(V.map(function(n,v){return ['v'+v,n];})).concat([['status','status']]).concat(review?[['review','review']]:[]).forEach(function(h){
  var th=el('th',{'class':h[0]==='input'||h[0]==='review'?'':'sortable','data-key':h[0]},h[1]);
  if(th.className){th.addEventListener('click',function(){sortDir=sortKey===h[0]?-sortDir:1;sortKey=h[0];render();});}head.appendChild(th);});
 // The view lives in the URL's hash: a link shares it.
 function readHash(){location.hash.replace(/^#/,'').split('&').forEach(function(part){var kv=part.split('=');if(kv.length!==2){return;}var k=kv[0],v=decodeURIComponent(kv[1]);
  if(k==='q'){search.value=v;}else if(k==='show'){which.value=v;}else if(k==='open'){v.split(',').forEach(function(id){if(id){open[id]=true;}});}
  else if(k==='sort'){var m=/^(-?)(.+)$/.exec(v);sortDir=m[1]?-1:1;sortKey=m[2];}
  else if(k==='group'){var at=v.indexOf(':');if(at>0){group=[v.slice(0,at),v.slice(at+1)];}}else if(k==='compare'){compareWith=v;}
  else if(k==='item'){var at_=v.split(':');if(at_.length===3){focus=v;data.cases.forEach(function(c){if(String(c.i)===at_[1]){open[c.id]=true;}});}}});}
 function writeHash(){var parts=[];if(search.value){parts.push('q='+encodeURIComponent(search.value));}if(which.value!=='all'){parts.push('show='+encodeURIComponent(which.value));}
  var ids=Object.keys(open).filter(function(id){return open[id];});if(ids.length){parts.push('open='+encodeURIComponent(ids.join(',')));}
  if(sortKey!=='i'){parts.push('sort='+(sortDir<0?'-':'')+sortKey);}if(group){parts.push('group='+encodeURIComponent(group[0]+':'+group[1]));}
  if(compareWith){parts.push('compare='+encodeURIComponent(compareWith));}if(focus){parts.push('item='+encodeURIComponent(focus));}
  if(history.replaceState){history.replaceState(null,'',parts.length?'#'+parts.join('&'):location.pathname+location.search);}}
 function render(){renderRows();writeHash();}
 search.addEventListener('input',render);which.addEventListener('change',render);
 readHash();render();
 var focused=focus&&root.querySelector('.run.focus');if(focused&&focused.scrollIntoView){focused.scrollIntoView({block:'center'});}
 if(live){return compareSection(data,other,compareWith,function(id){compareWith=id;writeHash();});}
 other.appendChild(el('p',{'class':'hint'},'Comparing with another eval needs the server: open this eval in wesichain api at /evals/, or run wesichain eval compare.'));
 return Promise.resolve();}

function comparisonTable(list){var t=el('table',{'class':'summary compare'}),h=el('tr');
 ['baseline \u2192 candidate','pairs','pass rate','regressions','improvements','McNemar p','verdict'].forEach(function(x){h.appendChild(el('th',null,x));});
 add(t,add(el('thead'),h));var b=el('tbody');
 list.forEach(function(c){var tr=el('tr',{'class':c.significant_regression?'below':''});
  add(tr,el('th',null,c.a+' \u2192 '+c.b),el('td',null,c.pairs),el('td',null,pct(c.a_passed/Math.max(1,c.pairs))+' \u2192 '+pct(c.b_passed/Math.max(1,c.pairs))),
   el('td',null,c.worse+': '+(c.regressions.join(', ')||'-')+(c.more_regressions?' \u2026':'')),el('td',null,c.better+': '+(c.improvements.join(', ')||'-')+(c.more_improvements?' \u2026':'')),
   el('td',null,Number(c.p).toPrecision(3)),el('td',null,c.verdict));b.appendChild(tr);});
 t.appendChild(b);return t;}

function compareSection(data,holder,initial,remember){
 return api('/v1/evals?limit=100').then(function(list){var others=list.evals.filter(function(e){return e.id!==data.eval;});
  holder.textContent='';if(!others.length){return;}
  add(holder,el('h2',null,'Against another eval'));var pick=el('select',{id:'compare-with'});pick.appendChild(el('option',{value:''},'choose an eval\u2026'));
  others.forEach(function(e){pick.appendChild(el('option',{value:e.id},e.id+' ('+when(e.created_at)+')'));});
  var out=el('div',{id:'compare-result'});add(holder,add(el('div',{'class':'controls'}),el('label',{'for':'compare-with'},'baseline '),pick),out);
  function show(id){remember(id||null);out.textContent='';if(!id){return Promise.resolve();}
   out.appendChild(el('p',null,'comparing\u2026'));
   return api('/v1/evals/'+encodeURIComponent(id)+'/compare/'+encodeURIComponent(data.eval)).then(function(res){out.textContent='';
    out.appendChild(comparisonTable(res.comparisons));
    var t=el('table',{'class':'pairs',id:'compare-cases'}),h=el('tr');['case','repeat','variant','baseline','candidate','change'].forEach(function(x){h.appendChild(el('th',null,x));});
    add(t,add(el('thead'),h));var b=el('tbody');
    res.cases.forEach(function(p){var change=p.baseline===p.candidate?'same':(p.candidate?'improvement':'regression');
     var tr=el('tr',{'class':'pair '+change});add(tr,el('td',null,p.case_id),el('td',null,p.repeat),el('td',null,p.variant),
      el('td',{'class':p.baseline?'pass':'fail'},p.baseline?'pass':'fail'),el('td',{'class':p.candidate?'pass':'fail'},p.candidate?'pass':'fail'),el('td',null,change));b.appendChild(tr);});
    t.appendChild(b);out.appendChild(t);if(res.truncated){out.appendChild(el('p',{'class':'hint'},'showing the first '+res.cases.length+' pairs'));}})
    .catch(function(err){out.textContent=err.message;});}
  pick.addEventListener('change',function(){show(pick.value);});
  if(initial){pick.value=initial;return show(initial);}});}

// -- the index of evals -------------------------------------------------------------------------
function renderIndex(data,live){root.textContent='';document.title='Evals';add(root,el('h1',null,'Evals'));
 var evals=data.evals.slice().sort(function(a,b){return b.created_at-a.created_at;});
 if(!evals.length){root.appendChild(el('p',{id:'no-evals'},'No evals yet: wesichain eval run SPEC.toml creates one.'));return;}
 var t=el('table',{'class':'summary',id:'evals'}),h=el('tr');['eval','spec','ran','status','verdict','cases','code','pass rate per variant'].forEach(function(x){h.appendChild(el('th',null,x));});
 add(t,add(el('thead'),h));var b=el('tbody');
 evals.forEach(function(e){var tr=el('tr',{'class':'eval','data-eval':e.id}),href=live?'/evals/'+encodeURIComponent(e.id):(data.links||{})[e.id],cell=el('td');
  cell.appendChild(href?el('a',{href:href},e.id):el('span',null,e.id));
  add(tr,cell,el('td',null,e.name),el('td',null,when(e.created_at)),el('td',null,e.status),el('td',{'class':'verdict-cell '+e.verdict},e.verdict),el('td',null,e.cases),
   el('td',null,e.code_version?e.code_version.slice(0,10):'-'),el('td',null,e.variants.map(function(v){return v.name+' '+pct(v.rate);}).join(' \u00b7 ')));b.appendChild(tr);});
 t.appendChild(b);root.appendChild(t);
 // Trends per spec: pass rate per variant, and each scorer's mean per variant, over time.
 add(root,el('h2',null,'Trends'));var names=[];evals.forEach(function(e){if(names.indexOf(e.name)<0){names.push(e.name);}});
 var trends=el('div',{'class':'trends',id:'trends'});root.appendChild(trends);
 names.forEach(function(name){var runs=evals.filter(function(e){return e.name===name;}).reverse(),xs=runs.map(function(e){return e.id;});
  var variants=[],scorers=[];runs.forEach(function(e){e.variants.forEach(function(v){if(variants.indexOf(v.name)<0){variants.push(v.name);}
   Object.keys(v.scores).forEach(function(n){if(scorers.indexOf(n)<0){scorers.push(n);}});});});
  function value(e,vn,f){var v=e.variants.filter(function(x){return x.name===vn;})[0];return v&&v.runs?f(v):null;}
  trends.appendChild(trend(name+': pass rate',xs,variants.map(function(vn){return {name:vn,values:runs.map(function(e){return value(e,vn,function(v){return v.rate;});})};})));
  scorers.sort().forEach(function(sn){trends.appendChild(trend(name+': '+sn+' (mean)',xs,variants.map(function(vn){return {name:vn,values:runs.map(function(e){return value(e,vn,function(v){return sn in v.scores?v.scores[sn]:null;});})};})));});});
 // Any two evals side by side.
 add(root,el('h2',null,'Compare two evals'));
 if(!live){root.appendChild(el('p',{'class':'hint'},'The paired comparison of two evals needs the server (wesichain api, /evals/) or wesichain eval compare A B.'));return;}
 var a=el('select',{id:'compare-a'}),c=el('select',{id:'compare-b'});evals.forEach(function(e){a.appendChild(el('option',{value:e.id},e.id));c.appendChild(el('option',{value:e.id},e.id));});
 if(evals.length>1){a.value=evals[1].id;}var go=el('button',{id:'compare-go',type:'button'},'Compare');
 go.addEventListener('click',function(){location.href='/evals/'+encodeURIComponent(c.value)+'#compare='+encodeURIComponent(a.value);});
 add(root,add(el('div',{'class':'controls'}),el('label',null,'baseline '),a,el('label',null,' candidate '),c,go));}

function start(){
 if(!boot.live){if(boot.page==='index'){renderIndex(boot,false);}else{renderEval(boot,false);}ready();return;}
 var path=location.pathname.replace(/\/+$/,'');
 if(boot.page==='index'||path==='/evals'){guarded(api('/v1/evals?limit=100').then(function(list){renderIndex(list,true);ready();}),start);return;}
 var id=decodeURIComponent(path.slice('/evals/'.length));
 guarded(api('/v1/evals/'+encodeURIComponent(id)).then(function(d){return renderEval(d,true);}).then(ready),start);}
start();
})();
